// Drives `duckrun serve` with the official OpenAI Node client (npm package
// openai 4.x, or 7.x with --v7, fetched by utils/fetch-openai-client.sh)
// and prints stable lines for FileCheck.
//
//   node openai-client.cjs <openai-package-dir> <base-url> <api-key> <scenario> [arg]
//
// Scenarios:
//   models         print `model <id>` for each listed model
//   chat           one non-streaming chat completion, checked field by field
//   stream         one streaming chat completion (with the usage chunk),
//                  checked chunk by chunk, then compared with the same
//                  request non-streamed (greedy, so the texts must agree)
//   completions    one legacy text completion
//   badkey         expects 401 (OpenAI.AuthenticationError) for <api-key>
//   concurrent N   N streaming chat completions at once, the first N
//                  prompts of prompts.json (their answers differ); prints
//                  `stream <i> <JSON-escaped text>` for each, by i
//   json AJV_DIR   response_format json_object and json_schema (several
//                  schemas, seeds and temperatures, streamed and not,
//                  max_tokens 64 to 224): every output parses, validates
//                  against its schema with ajv (AJV_DIR: what
//                  utils/fetch-ajv.sh prints) and ends with finish_reason
//                  "stop"; the stream gives the same text as the same
//                  request not streamed; a schema outside the subset and a
//                  max_tokens too small for the schema are 400s naming the
//                  field. Prints `json <schema> ok` lines, then `json ok`.
//   tools AJV_DIR  tools with tool_choice "required" and a named function
//                  (seeds, temperatures, streamed and not): one tool call
//                  each, finish_reason "tool_calls", a tool the request
//                  allows, arguments that parse and validate against its
//                  parameters with ajv, the stream's delta.tool_calls
//                  adding up to the non-streamed call; a conversation with
//                  tool results under "none" and one under "auto" are
//                  answered as text; an unknown function and a schema
//                  outside the subset are 400s naming the field. Prints
//                  `tools ok`.
//   tools-auto AJV_DIR ID   against a server whose tokenizer has the
//                  token "<tool_call>" as id ID (serve.py tool-tokenizer):
//                  tool_choice "auto" answers text, and with a logit_bias
//                  of +100 on ID a tool call (from the marker on, the
//                  grammar holds), streamed and not, its arguments valid;
//                  "required" still gives a valid call. Prints
//                  `tools-auto ok`.
//   reasoning AJV_DIR TOOL THINK END   against the same server (its
//                  tokenizer has "<think>" as THINK and "</think>" as END):
//                  sampled answers with logit biases on both, asked with
//                  reasoning_format "none" (the raw text), by default and
//                  streamed: reasoning_content and content are the raw
//                  text's leading <think> block and what follows it less
//                  its leading newlines, the usage the same; a bad
//                  reasoning_format is a 400. Prints `reasoning ok`.
//
// The model is $DUCK_SERVE_MODEL if set, else the first one the server lists.
// Any failed expectation or thrown error: a message on stderr naming the
// scenario, and exit status 1.
'use strict';

const [pkgDir, baseURL, apiKey, scenario, arg] = process.argv.slice(2);
if (!pkgDir || !baseURL || !apiKey || !scenario) {
  process.stderr.write(
    'usage: node openai-client.cjs <openai-package-dir> <base-url> <api-key> <scenario> [arg]\n');
  process.exit(2);
}

const OpenAI = require(pkgDir);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });

class Failed extends Error {}

function expect(cond, what) {
  if (!cond) throw new Failed(what);
}

function show(v) {
  return JSON.stringify(v);
}

function out(line) {
  process.stdout.write(line + '\n');
}

async function pickModel() {
  if (process.env.DUCK_SERVE_MODEL) return process.env.DUCK_SERVE_MODEL;
  const page = await client.models.list();
  expect(page.data.length > 0, 'the server lists no model');
  return page.data[0].id;
}

function checkUsage(usage, maxTokens, what) {
  expect(usage && typeof usage === 'object', `${what}: no usage (${show(usage)})`);
  expect(Number.isInteger(usage.prompt_tokens) && usage.prompt_tokens > 0,
         `${what}: usage.prompt_tokens is ${show(usage.prompt_tokens)}, expected > 0`);
  expect(Number.isInteger(usage.completion_tokens) && usage.completion_tokens >= 1 &&
           usage.completion_tokens <= maxTokens,
         `${what}: usage.completion_tokens is ${show(usage.completion_tokens)}, expected 1..${maxTokens}`);
  expect(usage.total_tokens === usage.prompt_tokens + usage.completion_tokens,
         `${what}: usage.total_tokens is ${show(usage.total_tokens)}, expected ` +
           `${usage.prompt_tokens} + ${usage.completion_tokens}`);
}

function checkFinish(reason, what) {
  expect(reason === 'stop' || reason === 'length',
         `${what}: finish_reason is ${show(reason)}, expected "stop" or "length"`);
}

// One non-streaming chat completion; returns the checked response.
async function chatOnce(model, content, maxTokens, what) {
  const r = await client.chat.completions.create({
    model,
    messages: [{ role: 'user', content }],
    max_tokens: maxTokens,
    temperature: 0,
  });
  expect(r.object === 'chat.completion', `${what}: object is ${show(r.object)}, expected "chat.completion"`);
  expect(Array.isArray(r.choices) && r.choices.length === 1,
         `${what}: ${show(r.choices && r.choices.length)} choices, expected 1`);
  const c = r.choices[0];
  expect(c.message && c.message.role === 'assistant',
         `${what}: message.role is ${show(c.message && c.message.role)}, expected "assistant"`);
  expect(typeof c.message.content === 'string',
         `${what}: message.content is ${show(c.message.content)}, expected a string`);
  checkFinish(c.finish_reason, what);
  checkUsage(r.usage, maxTokens, what);
  return r;
}

// One streaming chat completion with the usage chunk; returns
// { chunks, text, finish, usage } after checking every chunk.
async function streamOnce(model, content, maxTokens, what) {
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: 'user', content }],
    max_tokens: maxTokens,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  expect(chunks.length >= 2, `${what}: ${chunks.length} chunks, expected at least 2`);

  let id = null;
  let sawRole = false;
  let finish = null;
  let finishes = 0;
  let text = '';
  chunks.forEach((chunk, n) => {
    const at = `${what}: chunk ${n}`;
    const last = n === chunks.length - 1;
    expect(chunk.object === 'chat.completion.chunk',
           `${at}: object is ${show(chunk.object)}, expected "chat.completion.chunk"`);
    expect(typeof chunk.id === 'string' && chunk.id.length > 0, `${at}: no id`);
    if (id === null) id = chunk.id;
    expect(chunk.id === id, `${at}: id ${show(chunk.id)} differs from the first chunk's ${show(id)}`);
    expect(Array.isArray(chunk.choices), `${at}: choices is ${show(chunk.choices)}, expected an array`);
    if (last) {
      expect(chunk.choices.length === 0,
             `${at} (last): choices is ${show(chunk.choices)}, expected [] on the usage chunk`);
      return;
    }
    expect(chunk.usage === undefined || chunk.usage === null,
           `${at}: usage ${show(chunk.usage)} before the last chunk`);
    expect(chunk.choices.length === 1, `${at}: ${chunk.choices.length} choices, expected 1`);
    const choice = chunk.choices[0];
    expect(choice.index === 0, `${at}: choice index ${show(choice.index)}, expected 0`);
    const delta = choice.delta || {};
    if (!sawRole) {
      expect(delta.role === 'assistant',
             `${at} (first with choices): delta.role is ${show(delta.role)}, expected "assistant"`);
      sawRole = true;
    }
    if (delta.content !== undefined && delta.content !== null) {
      expect(typeof delta.content === 'string', `${at}: delta.content is ${show(delta.content)}`);
      expect(finishes === 0, `${at}: content after the finish_reason chunk`);
      text += delta.content;
    }
    if (choice.finish_reason !== undefined && choice.finish_reason !== null) {
      finishes++;
      finish = choice.finish_reason;
    }
  });
  expect(sawRole, `${what}: no chunk with choices`);
  expect(finishes === 1, `${what}: ${finishes} chunks with a finish_reason, expected exactly 1`);
  checkFinish(finish, what);
  const usage = chunks[chunks.length - 1].usage;
  checkUsage(usage, maxTokens, `${what}: last chunk`);
  return { chunks: chunks.length, text, finish, usage };
}

// One chat completion, streamed or not: { text, finish, usage }.
async function complete(params, stream, what) {
  if (!stream) {
    const r = await client.chat.completions.create(params);
    checkUsage(r.usage, params.max_tokens, what);
    return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason };
  }
  const s = await client.chat.completions.create(
    { ...params, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  for await (const chunk of s) {
    for (const c of chunk.choices) {
      text += (c.delta && c.delta.content) || '';
      finish = c.finish_reason || finish;
    }
  }
  return { text, finish };
}

const jsonSchemas = {
  person: {
    type: 'object',
    properties: {
      name: { type: 'string' },
      age: { type: 'integer' },
      email: { type: 'string' },
      tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, maxItems: 3 },
    },
    required: ['name', 'age', 'tags'],
    additionalProperties: false,
  },
  order: {
    type: 'object',
    properties: {
      lines: {
        type: 'array', minItems: 1, maxItems: 2,
        items: {
          type: 'object',
          properties: { id: { type: 'integer' }, price: { type: 'number' },
                        ok: { type: 'boolean' }, note: { type: ['string', 'null'] } },
          required: ['id', 'price', 'ok', 'note'], additionalProperties: false,
        },
      },
      meta: { type: 'object', properties: { kind: { const: 'order' }, n: { type: 'integer' } },
              required: ['kind', 'n'], additionalProperties: false },
    },
    required: ['lines', 'meta'],
    additionalProperties: false,
  },
  choices: {
    type: 'object',
    properties: { color: { enum: ['red', 'green', 'blue'] }, level: { enum: [1, 2, 12] },
                  none: { type: 'null' }, any: {} },
    required: ['color', 'level', 'none', 'any'],
    additionalProperties: false,
  },
  free: { type: 'object' },
  numbers: { type: 'array', items: { type: 'number' }, minItems: 2 },
};

// A request that must be a 400 naming `param`, its message containing `word`.
async function expect400(params, param, word, what) {
  let err = null;
  try {
    await client.chat.completions.create(params);
  } catch (e) {
    err = e;
  }
  expect(err !== null, `${what}: answered, expected a 400`);
  if (!(err instanceof OpenAI.BadRequestError)) throw err;
  const body = err.error || {};
  expect(body.param === param && String(body.message).includes(word),
         `${what}: ${show(body)}, expected param ${param} and ${show(word)} in the message`);
}

// One streamed chat completion with tools, its deltas checked as OpenAI
// sends them: content (if any) before the tool call; the call's first
// delta has index 0, its id, type "function" and the name (arguments
// ""), the later ones index 0 and a piece of the arguments only. Returns
// the content, the name, the arguments, how many chunks carried
// arguments, and the finish reason.
// The reasoning scenario's sampled answers, and the biases that make them
// open and close think blocks on random weights.
const [BIAS_SEEDS, THINK_BIAS, END_BIAS] = [12, 6, 4];

async function streamToolCall(params, what) {
  const s = await client.chat.completions.create({ ...params, stream: true });
  const acc = { content: '', name: null, arguments: '', pieces: 0, finish: null };
  for await (const chunk of s)
    for (const ch of chunk.choices) {
      const d = ch.delta || {};
      if (d.content) {
        expect(acc.name === null, `${what} (streamed): content ${show(d.content)} after the call began`);
        acc.content += d.content;
      }
      for (const t of d.tool_calls || []) {
        expect(t.index === 0, `${what} (streamed): tool call index ${show(t.index)}`);
        const f = t.function || {};
        if (acc.name === null) {
          expect(typeof t.id === 'string' && t.id.length > 0 && t.type === 'function' &&
                   typeof f.name === 'string' && f.name.length > 0 && f.arguments === '',
                 `${what} (streamed): first tool call delta ${show(t)}`);
          acc.name = f.name;
        } else {
          expect(t.id === undefined && f.name === undefined && typeof f.arguments === 'string' &&
                   f.arguments.length > 0,
                 `${what} (streamed): a later tool call delta ${show(t)}`);
          acc.arguments += f.arguments;
          acc.pieces += 1;
        }
      }
      acc.finish = ch.finish_reason || acc.finish;
    }
  return acc;
}

const scenarios = {
  async models() {
    const page = await client.models.list();
    expect(Array.isArray(page.data), `data is ${show(page.data)}, expected an array`);
    for await (const m of page) {
      expect(m.object === 'model', `model ${show(m.id)}: object is ${show(m.object)}, expected "model"`);
      out(`model ${m.id}`);
    }
  },

  async chat() {
    const model = await pickModel();
    const r = await chatOnce(model, 'Hello', 8, 'chat');
    const c = r.choices[0];
    out(`chat finish=${c.finish_reason} completion_tokens=${r.usage.completion_tokens} ` +
        `content_len=${c.message.content.length}`);
    out('chat ok');
  },

  async stream() {
    const model = await pickModel();
    const s = await streamOnce(model, 'Hello', 8, 'stream');
    out(`stream chunks=${s.chunks} finish=${s.finish} completion_tokens=${s.usage.completion_tokens}`);
    out('stream ok');
    const r = await chatOnce(model, 'Hello', 8, 'stream (non-streamed)');
    const full = r.choices[0].message.content;
    expect(full === s.text, `streamed text ${show(s.text)} differs from non-streamed ${show(full)}`);
    expect(r.choices[0].finish_reason === s.finish,
           `streamed finish_reason ${s.finish} differs from non-streamed ${r.choices[0].finish_reason}`);
    expect(r.usage.completion_tokens === s.usage.completion_tokens,
           `streamed completion_tokens ${s.usage.completion_tokens} differ from non-streamed ` +
             `${r.usage.completion_tokens}`);
    out('stream matches non-stream');
  },

  async completions() {
    const model = await pickModel();
    const r = await client.completions.create({ model, prompt: 'The', max_tokens: 6, temperature: 0 });
    expect(r.object === 'text_completion', `object is ${show(r.object)}, expected "text_completion"`);
    expect(Array.isArray(r.choices) && r.choices.length === 1,
           `${show(r.choices && r.choices.length)} choices, expected 1`);
    const c = r.choices[0];
    expect(typeof c.text === 'string', `choices[0].text is ${show(c.text)}, expected a string`);
    checkFinish(c.finish_reason, 'completions');
    checkUsage(r.usage, 6, 'completions');
    out(`completions finish=${c.finish_reason} completion_tokens=${r.usage.completion_tokens}`);
    out('completions ok');
  },

  async badkey() {
    // Both a listing and a generation must be refused; the model name does
    // not matter since the key is checked first.
    const model = process.env.DUCK_SERVE_MODEL || 'any';
    const calls = [
      ['models.list', () => client.models.list()],
      ['chat.completions.create', () => client.chat.completions.create({
         model, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 1 })],
    ];
    for (const [name, call] of calls) {
      let err = null;
      try {
        await call();
      } catch (e) {
        err = e;
      }
      expect(err !== null, `${name} succeeded with a wrong key`);
      if (!(err instanceof OpenAI.AuthenticationError)) throw err;
      expect(err.status === 401, `${name}: status ${err.status}, expected 401`);
    }
    out('badkey status=401');
  },

  async json() {
    const Ajv = require(arg);
    const ajv = new Ajv({ allErrors: true });
    const model = await pickModel();
    const base = { model, messages: [{ role: 'user', content: 'Give me JSON.' }] };
    const formats = Object.entries(jsonSchemas).map(([name, schema]) => [name, schema,
      { type: 'json_schema', json_schema: { name, schema, strict: true } }]);
    formats.push(['json_object', { type: 'object' }, { type: 'json_object' }]);
    let outputs = 0;
    for (const [name, schema, format] of formats) {
      const validate = ajv.compile(schema);
      const runs = [[0, 0, 64], [1, 1, 64], [1, 2, 64], [1, 3, 160], [0.7, 4, 64]];
      for (const [temperature, seed, max] of runs) {
        // The order schema's shortest JSON takes 80 tokens.
        const maxTokens = name === 'order' ? max + 64 : max;
        const params = { ...base, response_format: format, temperature, seed, max_tokens: maxTokens };
        const what = `json ${name} temperature ${temperature} seed ${seed} max_tokens ${maxTokens}`;
        const plain = await complete(params, false, what);
        const streamed = await complete(params, true, `${what} (streamed)`);
        expect(streamed.text === plain.text,
               `${what}: streamed ${show(streamed.text)} differs from ${show(plain.text)}`);
        for (const r of [plain, streamed]) {
          expect(r.finish === 'stop', `${what}: finish_reason ${show(r.finish)} for ${show(r.text)}`);
          let v;
          try {
            v = JSON.parse(r.text);
          } catch (e) {
            throw new Failed(`${what}: ${show(r.text)} is not JSON: ${e.message}`);
          }
          expect(validate(v), `${what}: ${show(r.text)} fails the schema: ${show(validate.errors)}`);
          outputs++;
        }
      }
      out(`json ${name} ok`);
    }
    const bad = { ...base, max_tokens: 64 };
    await expect400({ ...bad, response_format: { type: 'json_schema', json_schema: {
      name: 'x', schema: { type: 'object', properties: { a: { anyOf: [{ type: 'string' }] } } } } } },
                    'response_format', "'anyOf'", 'json unsupported keyword');
    await expect400({ ...base, max_tokens: 10, response_format: formats[0][2] },
                    'max_tokens', 'shortest JSON', 'json max_tokens too small');
    await expect400({ ...bad, response_format: { type: 'yaml' } }, 'response_format', 'yaml',
                    'json unknown type');
    out(`json: ${outputs} outputs parse and validate; bad formats refused`);
    out('json ok');
  },

  async tools() {
    const Ajv = require(arg);
    const ajv = new Ajv({ allErrors: true });
    const model = await pickModel();
    const tools = [
      { type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
        parameters: { type: 'object', properties: { city: { type: 'string' },
          unit: { enum: ['celsius', 'fahrenheit'] } }, required: ['city', 'unit'],
          additionalProperties: false } } },
      { type: 'function', function: { name: 'add', parameters: { type: 'object',
        properties: { a: { type: 'integer' }, b: { type: 'number' } }, required: ['a', 'b'] } } },
      { type: 'function', function: { name: 'ping' } },
    ];
    const validators = {};
    for (const t of tools)
      validators[t.function.name] = ajv.compile(t.function.parameters || { type: 'object' });
    const base = { model, messages: [{ role: 'user', content: 'What is the weather in Paris?' }], tools };
    const choices = [['required', 'required'], ...tools.map((t) =>
      [t.function.name, { type: 'function', function: { name: t.function.name } }])];
    let calls = 0;
    let pieces = 0; // the most argument chunks one streamed call came in
    const names = new Set();
    for (const [label, tool_choice] of choices) {
      for (const [temperature, seed] of [[0, 0], [1, 1], [1, 2], [0.8, 3]]) {
        const params = { ...base, tool_choice, temperature, seed, max_tokens: 160 };
        const what = `tools ${label} temperature ${temperature} seed ${seed}`;
        const r = await client.chat.completions.create(params);
        const c = r.choices[0];
        expect(c.finish_reason === 'tool_calls', `${what}: finish_reason ${show(c.finish_reason)}`);
        const tc = c.message.tool_calls;
        expect(Array.isArray(tc) && tc.length === 1, `${what}: tool_calls ${show(tc)}`);
        const call = tc[0];
        expect(call.type === 'function' && typeof call.id === 'string' && call.id.length > 0,
               `${what}: call ${show(call)}`);
        const name = call.function.name;
        expect(label === 'required' ? name in validators : name === label,
               `${what}: function ${show(name)}`);
        let args;
        try {
          args = JSON.parse(call.function.arguments);
        } catch (e) {
          throw new Failed(`${what}: arguments ${show(call.function.arguments)} are not JSON`);
        }
        const v = validators[name];
        expect(v(args), `${what}: arguments ${show(args)} fail ${name}'s schema: ${show(v.errors)}`);
        names.add(name);
        // Streamed: delta.tool_calls add up to the same call.
        const acc = await streamToolCall(params, what);
        expect(acc.finish === 'tool_calls' && acc.name === name && acc.content === '' &&
                 acc.arguments === call.function.arguments,
               `${what} (streamed): ${show(acc)}, expected ${show(call.function)}`);
        pieces = Math.max(pieces, acc.pieces);
        calls += 2;
      }
    }
    // A conversation with a tool call and its result, the tools still shown.
    const turn = await client.chat.completions.create({ model, tools, tool_choice: 'none', max_tokens: 8,
      messages: [...base.messages,
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
          function: { name: 'get_weather', arguments: '{"city": "Paris", "unit": "celsius"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: '21 degrees' }] });
    expect(typeof turn.choices[0].message.content === 'string' && !turn.choices[0].message.tool_calls,
           `tools none: ${show(turn.choices[0].message)}`);
    // "auto" (the default): free text here (these tokenizers have no
    // <tool_call> token, so random weights never start a call).
    const auto = await client.chat.completions.create({ ...base, max_tokens: 8 });
    expect(typeof auto.choices[0].message.content === 'string' && !auto.choices[0].message.tool_calls &&
             auto.choices[0].finish_reason !== 'tool_calls', `tools auto: ${show(auto.choices[0])}`);
    await expect400({ ...base, max_tokens: 64, tool_choice: { type: 'function', function: { name: 'nope' } } },
                    'tool_choice', 'nope', 'tools unknown function');
    await expect400({ ...base, max_tokens: 64, tool_choice: 'required', tools: [{ type: 'function',
      function: { name: 'f', parameters: { type: 'object', properties: { x: { oneOf: [] } } } } }] },
                    'tools', "'oneOf'", 'tools unsupported keyword');
    // The arguments are streamed as they are generated, not whole at the end.
    expect(pieces >= 4, `tools: the arguments came in at most ${pieces} chunks`);
    out(`tools: ${calls} calls of ${names.size} functions are well-formed and validate; bad choices refused`);
    out('tools ok');
  },

  async 'tools-auto'() {
    const [ajvDir, id] = [arg, process.argv[7]];
    const ajv = new (require(ajvDir))({ allErrors: true });
    const model = await pickModel();
    const params = { type: 'object', properties: { city: { type: 'string' },
      days: { type: 'integer' } }, required: ['city', 'days'], additionalProperties: false };
    const tools = [{ type: 'function', function: { name: 'forecast', parameters: params } }];
    const validate = ajv.compile(params);
    const base = { model, tools, messages: [{ role: 'user', content: 'Weather?' }], max_tokens: 128 };
    const runs = [['auto text', { tool_choice: 'auto', temperature: 1, seed: 5 }, false],
                  ['auto biased', { temperature: 1, seed: 6, logit_bias: { [id]: 100 } }, true],
                  ['required', { tool_choice: 'required', temperature: 0 }, true]];
    for (const [what, extra, wantCall] of runs) {
      const r = await client.chat.completions.create({ ...base, ...extra });
      const c = r.choices[0];
      const acc = await streamToolCall({ ...base, ...extra }, `tools-auto ${what}`);
      const [text, args, finish] = [acc.content, acc.arguments, acc.finish];
      if (!wantCall) {
        expect(!c.message.tool_calls && c.finish_reason !== 'tool_calls' &&
                 c.message.content === text && finish === c.finish_reason,
               `tools-auto ${what}: ${show(c)} streamed ${show(text)}`);
        continue;
      }
      const tc = c.message.tool_calls;
      expect(c.finish_reason === 'tool_calls' && Array.isArray(tc) && tc.length === 1 &&
               tc[0].function.name === 'forecast',
             `tools-auto ${what}: ${show(c)}`);
      const a = JSON.parse(tc[0].function.arguments);
      expect(validate(a), `tools-auto ${what}: ${show(a)}: ${show(validate.errors)}`);
      expect(finish === 'tool_calls' && args === tc[0].function.arguments &&
               text === (c.message.content || '') && acc.name === 'forecast',
             `tools-auto ${what} (streamed): ${show(args)} ${show(text)} finish ${show(finish)}`);
    }
    out('tools-auto ok');
  },

  async reasoning() {
    const [think, endThink] = [process.argv[8], process.argv[9]];
    const model = await pickModel();
    // What the server should make of the raw text (vLLM's Qwen3 parser):
    // a leading <think> block is the reasoning, the rest the content less
    // its leading newlines.
    const split = (raw) => {
      if (!raw.startsWith('<think>')) return { reasoning: undefined, content: raw };
      const rest = raw.slice('<think>'.length);
      const at = rest.indexOf('</think>');
      if (at < 0) return { reasoning: rest, content: '' };
      return { reasoning: rest.slice(0, at), content: rest.slice(at + '</think>'.length).replace(/^\n+/, '') };
    };
    let thought = 0;
    let both = 0;
    for (let seed = 1; seed <= BIAS_SEEDS; ++seed) {
      const params = { model, messages: [{ role: 'user', content: 'Think first.' }], max_tokens: 24,
        temperature: 1, seed, logit_bias: { [think]: THINK_BIAS, [endThink]: END_BIAS } };
      const what = `reasoning seed ${seed}`;
      const raw = await client.chat.completions.create({ ...params, reasoning_format: 'none' });
      const rawText = raw.choices[0].message.content;
      expect(raw.choices[0].message.reasoning_content === undefined, `${what}: 'none' gave ${show(raw.choices[0])}`);
      const want = split(rawText);
      const r = await client.chat.completions.create(params);
      const m = r.choices[0].message;
      expect(m.reasoning_content === want.reasoning && m.content === want.content,
             `${what}: ${show(m)} from ${show(rawText)}`);
      expect(r.usage.completion_tokens === raw.usage.completion_tokens &&
               r.choices[0].finish_reason === raw.choices[0].finish_reason,
             `${what}: usage ${show(r.usage)} finish ${r.choices[0].finish_reason}, raw ${show(raw.usage)}`);
      const s = await client.chat.completions.create({ ...params, stream: true });
      let [reasoning, content, finish] = ['', '', null];
      for await (const chunk of s)
        for (const ch of chunk.choices) {
          reasoning += (ch.delta && ch.delta.reasoning_content) || '';
          content += (ch.delta && ch.delta.content) || '';
          finish = ch.finish_reason || finish;
        }
      expect(reasoning === (want.reasoning || '') && content === want.content && finish === r.choices[0].finish_reason,
             `${what} (streamed): ${show({ reasoning, content, finish })} from ${show(rawText)}`);
      thought += want.reasoning !== undefined;
      both += !!(want.reasoning && rawText.includes('</think>') && want.content);
    }
    await expect400({ model, messages: [{ role: 'user', content: 'x' }], reasoning_format: 'html' },
                    'reasoning_format', 'none', 'reasoning bad format');
    out(`reasoning: ${thought} of ${BIAS_SEEDS} answers think, ${both} with content after; ` +
        'streamed and not, they split as the raw text does');
    out('reasoning ok');
  },

  async concurrent() {
    const n = Number(arg);
    expect(Number.isInteger(n) && n >= 1, `N is ${show(arg)}, expected a positive integer`);
    const model = await pickModel();
    const prompts = require('./prompts.json');
    expect(n <= prompts.length, `N is ${n}, prompts.json has ${prompts.length} prompts`);
    const is = Array.from({ length: n }, (_, k) => k + 1);
    const results = await Promise.all(
      is.map((i) => streamOnce(model, prompts[i - 1], 16, `concurrent stream ${i}`)));
    is.forEach((i, k) => out(`stream ${i} ${JSON.stringify(results[k].text)}`));
    out('concurrent ok');
  },
};

async function main() {
  const run = scenarios[scenario];
  if (!run) throw new Failed(`unknown scenario (one of: ${Object.keys(scenarios).join(', ')})`);
  await run();
}

main().then(
  () => {
    process.exitCode = 0;
  },
  (e) => {
    const what = e instanceof Failed ? e.message
      : e instanceof OpenAI.APIError ? `${e.constructor.name} (status ${e.status}): ${e.message}`
      : (e && e.stack) || String(e);
    process.stderr.write(`openai-client ${scenario}: ${what}\n`);
    process.exitCode = 1;
  });
