// Encodes the parity corpus with each npm reference encoder; the vocabulary files those encoders ship are written
// beside it by tools/tokenizers/vocab_files.mjs. Usage: node export.mjs OUTDIR SHAKESPEARE_TXT
//
// OUTDIR receives:
//   docs.json                         {"plain": [text...], "special": [text...]}
//   expected/<encoding>.json          {"plain": [[id...]...], "special": [[id...]...] (absent for llama2)}
import fs from "node:fs";
import path from "node:path";
import { Tiktoken } from "js-tiktoken/lite";
import cl100k from "js-tiktoken/ranks/cl100k_base";
import o200k from "js-tiktoken/ranks/o200k_base";
import gpt2 from "js-tiktoken/ranks/gpt2";
import llama3 from "llama3-tokenizer-js";
import llama2 from "llama-tokenizer-js";
import { shakespeareDocuments, specialDocuments, variedDocuments } from "./corpus.mjs";

const [outDir, shakespearePath] = process.argv.slice(2);
if (!outDir || !shakespearePath) {
  console.error("usage: node export.mjs OUTDIR SHAKESPEARE_TXT");
  process.exit(2);
}
fs.mkdirSync(path.join(outDir, "expected"), { recursive: true });
const write = (rel, data) => fs.writeFileSync(path.join(outDir, rel), data);

// ---- corpus
const shakespeare = fs.readFileSync(shakespearePath, "utf8");
const plainDocs = [...shakespeareDocuments(shakespeare, 4000), ...variedDocuments(20240601, 420)];
const llama3Specials = llama3.vocabById.slice(128000);
const specialDocs = specialDocuments(7, 60, [...llama3Specials.slice(0, 12), "<|endoftext|>", "<|endofprompt|>",
                                             "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]);
write("docs.json", JSON.stringify({ plain: plainDocs, special: specialDocs }));
const totalBytes = plainDocs.reduce((n, d) => n + Buffer.byteLength(d), 0);

function expect(name, encodePlain, encodeSpecial) {
  const out = { plain: plainDocs.map(encodePlain) };
  if (encodeSpecial) out.special = specialDocs.map(encodeSpecial);
  write(path.join("expected", `${name}.json`), JSON.stringify(out));
}

for (const [name, data] of [["cl100k_base", cl100k], ["o200k_base", o200k], ["r50k_base", gpt2]]) {
  const enc = new Tiktoken(data);
  expect(name, (d) => enc.encode(d, [], []), (d) => enc.encode(d, "all"));
}
const never = /(?!)/g;
expect("llama3", (d) => llama3.encode(d, { bos: false, eos: false, specialTokenRegex: never }),
       (d) => llama3.encode(d, { bos: false, eos: false }));
expect("llama2", (d) => (d.length ? llama2.encode(d, false, true) : []), null);

console.log(`export: ${plainDocs.length} plain documents (${(totalBytes / 1e6).toFixed(2)} MB), ` +
            `${specialDocs.length} with special tokens -> ${outDir}`);
