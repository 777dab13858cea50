// Writes fortune(6) files as JSONL, one document a line: {"text": "<one fortune>"}. Fortune files separate their
// entries with lines holding only "%". Usage: node fortunes_jsonl.mjs OUT.jsonl FILE...
import fs from "node:fs";

const [out, ...inputs] = process.argv.slice(2);
if (!out || inputs.length === 0) {
  console.error("usage: node fortunes_jsonl.mjs OUT.jsonl FILE...");
  process.exit(2);
}
const lines = [];
for (const file of inputs) {
  for (const entry of fs.readFileSync(file, "utf8").split(/^%\n/m)) {
    const text = entry.trim();
    if (text) lines.push(JSON.stringify({ text }));
  }
}
fs.writeFileSync(out + ".tmp", lines.join("\n") + "\n");
fs.renameSync(out + ".tmp", out);
console.log(`fortunes_jsonl: ${lines.length} documents from ${inputs.length} files -> ${out}`);
