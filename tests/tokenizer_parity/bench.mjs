// Encoding speed of the JavaScript reference tokenizers on English text, for docs/perf/tokenizer.md, in megabytes
// per CPU-second of the process (user + system, so other processes on a shared machine do not count).
// Usage: node bench.mjs TEXT_FILE [SECONDS]   (run from the prepared OUTDIR, where node_modules lives)
// Prints one JSON line per encoder: {"encoder", "mb_per_cpu_s", "tokens"}.
import fs from "node:fs";
import { Tiktoken } from "js-tiktoken/lite";
import cl100k from "js-tiktoken/ranks/cl100k_base";
import o200k from "js-tiktoken/ranks/o200k_base";
import llama3 from "llama3-tokenizer-js";

const [file, secondsArg] = process.argv.slice(2);
const text = fs.readFileSync(file, "utf8");
const bytes = Buffer.byteLength(text);
const seconds = Number(secondsArg ?? 3);

const cpuSeconds = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
};

function bench(name, encode) {
  let tokens = encode(text).length;  // warm-up (JIT, caches)
  let runs = 0;
  const start = cpuSeconds();
  while (cpuSeconds() - start < seconds) {
    tokens = encode(text).length;
    runs++;
  }
  const s = cpuSeconds() - start;
  console.log(JSON.stringify({ encoder: name, mb_per_cpu_s: (bytes * runs) / s / 1e6, tokens }));
}

const cl = new Tiktoken(cl100k);
const o2 = new Tiktoken(o200k);
bench("js-tiktoken cl100k_base", (t) => cl.encode(t, [], []));
bench("js-tiktoken o200k_base", (t) => o2.encode(t, [], []));
bench("llama3-tokenizer-js", (t) => llama3.encode(t, { bos: false, eos: false, specialTokenRegex: /(?!)/g }));
