// duckrun serve's page: a streaming chat over /v1/chat/completions and the
// cluster from /v1/duck/status, polled every second. No libraries: the
// plots are drawn on canvases here. The API key (when the server has one)
// comes from the form, or from the URL's fragment (#key=...), which never
// reaches a server; it is kept in this tab's sessionStorage.
//
// URL parameters: ?prompt=TEXT&autosend=1 sends TEXT once the page loads
// (max_tokens=N and temperature=T set the form first).
"use strict";

const $ = (id) => document.getElementById(id);
const HISTORY = 120; // samples kept for the plots (one a second)
const samples = [];
const messages = []; // the conversation sent with each request
let busy = false;

function apiKey() {
  const m = /(?:^#|&)key=([^&]*)/.exec(location.hash);
  if (m) {
    sessionStorage.setItem("duck-key", decodeURIComponent(m[1]));
    window.history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("duck-key") || "";
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = apiKey();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function askForKey(note) {
  $("key-form").hidden = false;
  $("key-note").textContent = note;
}

//===--------------------------------------------------------------------===//
// Chat
//===--------------------------------------------------------------------===//

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  div.appendChild(body);
  $("messages").appendChild(div);
  $("messages").scrollTop = $("messages").scrollHeight;
  return div;
}

// Server-sent events from a fetch response: calls onEvent with each
// `data:` payload until the stream ends.
async function readEvents(resp, onEvent) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, i);
      buf = buf.slice(i + 2);
      for (const line of event.split("\n"))
        if (line.startsWith("data: ")) onEvent(line.slice(6));
    }
  }
}

async function send(text) {
  if (busy || !text) return;
  busy = true;
  $("send").disabled = true;
  messages.push({ role: "user", content: text });
  addMessage("user", text);
  const div = addMessage("assistant", "");
  div.classList.add("streaming");
  const body = div.querySelector(".text");
  let reasoning = null, content = "", finish = null;
  const request = {
    messages: messages,
    stream: true,
    temperature: Number($("temperature").value),
    max_tokens: Number($("max-tokens").value),
  };
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(request),
    });
    if (!resp.ok) {
      const e = await resp.json().catch(() => ({}));
      if (resp.status === 401) askForKey("the server wants its API key");
      throw new Error((e.error && e.error.message) || resp.statusText);
    }
    await readEvents(resp, (data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      const c = chunk.choices && chunk.choices[0];
      if (!c) return;
      if (c.delta.reasoning_content) {
        if (!reasoning) {
          reasoning = document.createElement("div");
          reasoning.className = "reasoning";
          div.insertBefore(reasoning, body);
        }
        reasoning.textContent += c.delta.reasoning_content;
      }
      if (c.delta.content) {
        content += c.delta.content;
        body.textContent = content;
      }
      if (c.finish_reason) finish = c.finish_reason;
    });
    messages.push({ role: "assistant", content: content });
  } catch (err) {
    messages.pop();
    div.classList.add("error");
    body.textContent = content + (content ? "\n" : "") + "error: " + err.message;
    finish = "error";
  }
  div.classList.remove("streaming");
  div.dataset.finish = finish || "none";
  busy = false;
  $("send").disabled = false;
}

//===--------------------------------------------------------------------===//
// Cluster
//===--------------------------------------------------------------------===//

function fmt(v, digits) {
  return v === null || v === undefined ? "-" : Number(v).toFixed(digits);
}

function cacheText(d) {
  if (d.weight_cache === "hit") return "cached";
  const mib = (d.uploaded_bytes / 1048576).toFixed(1);
  return (d.weight_cache === "miss" ? "uploaded " : "partly uploaded ") + mib + " MiB";
}

function showDucks(ducks) {
  const tbody = $("ducks").querySelector("tbody");
  tbody.textContent = "";
  for (const d of ducks) {
    const tr = document.createElement("tr");
    const cells = [
      String(d.index), d.address, d.health + " (" + fmt(d.last_answer_s_ago, 1) + " s ago)",
      String(d.cores), cacheText(d), fmt(d.kernel_gparam_s, 2),
    ];
    const names = ["duck", "address", "health", "cores", "cache", "gparam"];
    cells.forEach((text, i) => {
      const td = document.createElement("td");
      td.textContent = text;
      td.className = names[i];
      tr.appendChild(td);
    });
    tr.dataset.cache = d.weight_cache;
    tbody.appendChild(tr);
  }
}

function showStatus(s) {
  $("model").textContent = s.model;
  $("state").textContent = s.state;
  $("state").className = "state " + s.state;
  showDucks(s.ducks);
  $("judge-gap").textContent = fmt(s.judge_gap_us, 0) + " us";
  $("tok-s").textContent = fmt(s.tok_s, 1);
  $("queue").textContent = s.queue_depth;
  $("active").textContent = s.active_sequences;
  $("recoveries").textContent = s.recoveries;
  const b = s.step_breakdown || {};
  samples.push({
    tok: s.tok_s || 0, queue: s.queue_depth, active: s.active_sequences,
    step: [b.host_attention_ms, b.host_norms_router_ms, b.lm_head_ms,
           b.duck_kernel_ms, b.dispatch_gap_ms].map((v) => v || 0),
  });
  while (samples.length > HISTORY) samples.shift();
  drawPlots();
  // Statuses shown so far (a test waits for a few plotted points).
  document.body.dataset.polls = Number(document.body.dataset.polls || 0) + 1;
}

async function poll() {
  try {
    const resp = await fetch("/v1/duck/status", { headers: headers(), cache: "no-store" });
    if (resp.status === 401) {
      askForKey("the server wants its API key");
      $("state").textContent = "key needed";
    } else if (resp.ok) {
      showStatus(await resp.json());
    } else {
      $("state").textContent = "status " + resp.status;
    }
  } catch (err) {
    $("state").textContent = "unreachable";
  }
}

//===--------------------------------------------------------------------===//
// Plots
//===--------------------------------------------------------------------===//

const STEP_PARTS = [
  ["host attention", "#4e79a7"], ["host norms/router", "#f28e2b"],
  ["LM head", "#76b7b2"], ["duck kernel", "#e15759"], ["dispatch gap", "#b07aa1"],
];

// series: [{name, color, values}]; stacked: areas on top of each other.
function plot(canvas, series, stacked) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, left = 44, top = 16, bottom = 14;
  ctx.clearRect(0, 0, w, h);
  const n = series.length ? series[0].values.length : 0;
  const sums = new Array(n).fill(0);
  let max = 0;
  for (const s of series)
    s.values.forEach((v, i) => {
      sums[i] += v;
      max = Math.max(max, stacked ? sums[i] : v);
    });
  max = max > 0 ? max * 1.1 : 1;
  const x = (i) => left + ((w - left - 4) * (HISTORY - n + i)) / (HISTORY - 1);
  const y = (v) => h - bottom - ((h - top - bottom) * v) / max;
  ctx.strokeStyle = "#999";
  ctx.fillStyle = "#555";
  ctx.font = "10px sans-serif";
  ctx.beginPath();
  ctx.moveTo(left, top);
  ctx.lineTo(left, h - bottom);
  ctx.lineTo(w - 4, h - bottom);
  ctx.stroke();
  ctx.fillText(max >= 100 ? max.toFixed(0) : max.toPrecision(3), 2, top + 4);
  ctx.fillText("0", 2, h - bottom);
  ctx.fillText("-" + HISTORY + " s", left, h - 2);
  ctx.fillText("now", w - 24, h - 2);
  const base = new Array(n).fill(0);
  let lx = left + 6;
  for (const s of series) {
    ctx.strokeStyle = ctx.fillStyle = s.color;
    ctx.beginPath();
    s.values.forEach((v, i) => {
      const yv = y(stacked ? base[i] + v : v);
      if (i === 0) ctx.moveTo(x(i), yv);
      else ctx.lineTo(x(i), yv);
    });
    if (stacked && n > 0) {
      for (let i = n - 1; i >= 0; --i) ctx.lineTo(x(i), y(base[i]));
      ctx.closePath();
      ctx.globalAlpha = 0.7;
      ctx.fill();
      ctx.globalAlpha = 1;
      s.values.forEach((v, i) => (base[i] += v));
    } else {
      ctx.lineWidth = 2;
      ctx.stroke();
      ctx.lineWidth = 1;
    }
    ctx.fillText(s.name, lx, top - 4);
    lx += ctx.measureText(s.name).width + 12;
  }
}

function drawPlots() {
  plot($("plot-tok"), [{ name: "tok/s", color: "#4e79a7", values: samples.map((s) => s.tok) }], false);
  plot($("plot-step"), STEP_PARTS.map(([name, color], k) => ({
    name, color, values: samples.map((s) => s.step[k]),
  })), true);
  plot($("plot-queue"), [
    { name: "queue", color: "#e15759", values: samples.map((s) => s.queue) },
    { name: "active", color: "#59a14f", values: samples.map((s) => s.active) },
  ], false);
}

//===--------------------------------------------------------------------===//
// Start
//===--------------------------------------------------------------------===//

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("duck-key", $("key").value);
  $("key-form").hidden = true;
  poll();
});
$("chat-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("chat-form").requestSubmit();
  }
});
$("clear").addEventListener("click", () => {
  messages.length = 0;
  $("messages").textContent = "";
});

const params = new URLSearchParams(location.search);
if (params.has("max_tokens")) $("max-tokens").value = params.get("max_tokens");
if (params.has("temperature")) $("temperature").value = params.get("temperature");
apiKey();
poll();
setInterval(poll, 1000);
if (params.get("autosend") === "1" && params.get("prompt")) send(params.get("prompt"));
