// Renders a corpus of chats with a checkpoint's chat_template with
// @huggingface/jinja (the renderer transformers.js uses), for comparison
// with duck-tokenize --render-chat.
//
//   node render-chat-hf-jinja.mjs JINJA_PKG_DIR FAMILY tokenizer_config.json corpus.json
//
// Prints "=== NAME ===" then the prompt, for each case of the corpus whose
// "families" (default: all) include FAMILY.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import path from "node:path";

const [pkgDir, family, configPath, corpusPath] = process.argv.slice(2);
const { Template } = await import(
  pathToFileURL(path.join(pkgDir, "dist", "index.js")).href);
const config = JSON.parse(readFileSync(configPath, "utf8"));
let source = config.chat_template;
if (Array.isArray(source))
  source = source.find((t) => t.name === "default").template;
const token = (v) => (v && typeof v === "object" ? v.content : v) ?? "";
const template = new Template(source);
let out = "";
for (const c of JSON.parse(readFileSync(corpusPath, "utf8"))) {
  if (!(c.families ?? [family]).includes(family)) continue;
  const args = {
    messages: c.messages,
    add_generation_prompt: c.add_generation_prompt ?? true,
    bos_token: token(config.bos_token),
    eos_token: token(config.eos_token),
  };
  for (const key of ["tools", "enable_thinking"])
    if (key in c) args[key] = c[key];
  out += `=== ${c.name} ===\n` + template.render(args) + "\n";
}
process.stdout.write(out);
