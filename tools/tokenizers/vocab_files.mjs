// Writes the vocabularies shipped inside pinned npm tokenizer packages as the files users have, for the default job
// (scripts/run_default_job.sh) and the tokenizer parity tests. Usage: node vocab_files.mjs OUTDIR
//
// OUTDIR receives:
//   cl100k_base.tiktoken, o200k_base.tiktoken, r50k_base.tiktoken     `base64(bytes) rank` lines
//   llama3/tokenizer.model (rank file), llama3/tokenizer.json, llama3/tokenizer_config.json
//   gpt2/vocab.json, gpt2/merges.txt, gpt2/tokenizer.json (merges as "a b" strings, no tokenizer_config.json)
//   llama2/tokenizer.model            SentencePiece ModelProto (see writeSentencePieceModel)
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import cl100k from "js-tiktoken/ranks/cl100k_base";
import o200k from "js-tiktoken/ranks/o200k_base";
import gpt2 from "js-tiktoken/ranks/gpt2";
import llama3 from "llama3-tokenizer-js";
import llama2 from "llama-tokenizer-js";

// GPT-2's byte-to-unicode table (FORMATS.md section 5): printable bytes map to themselves, the other 68 bytes in
// ascending order to U+0100, U+0101, ...
const byteToChar = [];
{
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    byteToChar[b] = String.fromCodePoint(printable ? b : 256 + n++);
  }
}
const charToByte = new Map(byteToChar.map((c, b) => [c, b]));
const bytesToLevel = (bytes) => Array.from(bytes, (b) => byteToChar[b]).join("");
const levelToBytes = (s) => Uint8Array.from(Array.from(s), (c) => {
  if (!charToByte.has(c)) throw new Error(`not a byte-level string: ${JSON.stringify(s)}`);
  return charToByte.get(c);
});
const b64 = (bytes) => Buffer.from(bytes).toString("base64");

// js-tiktoken's compressed rank data: lines "! offset tok tok ..." where the i-th base64 token has rank offset+i.
function tiktokenRanks(data) {
  const ranks = [];
  for (const line of data.bpe_ranks.split("\n").filter(Boolean)) {
    const [, offsetStr, ...tokens] = line.split(" ");
    const offset = Number.parseInt(offsetStr, 10);
    tokens.forEach((t, i) => ranks.push([Buffer.from(t, "base64"), offset + i]));
  }
  ranks.sort((a, b) => a[1] - b[1]);
  return ranks;
}
const rankFile = (ranks) => ranks.map(([bytes, rank]) => `${b64(bytes)} ${rank}\n`).join("");

// The merge that created each token, recovered from ranks alone: running BPE on the token's bytes with only the
// lower-ranked tokens leaves exactly two parts. Merge i is the token of rank 256 + i in GPT-2's rank order.
function mergesFromRanks(ranks) {
  const rankOf = new Map(ranks.map(([bytes, rank]) => [bytes.toString("latin1"), rank]));
  const merges = [];
  for (const [bytes, rank] of ranks) {
    if (bytes.length < 2) continue;
    let parts = Array.from(bytes, (b) => Buffer.from([b]).toString("latin1"));
    for (;;) {
      let best = -1;
      let bestRank = Infinity;
      for (let i = 0; i + 1 < parts.length; i++) {
        const r = rankOf.get(parts[i] + parts[i + 1]);
        if (r !== undefined && r < rank && r < bestRank) [best, bestRank] = [i, r];
      }
      if (best < 0) break;
      parts.splice(best, 2, parts[best] + parts[best + 1]);
    }
    if (parts.length !== 2) throw new Error(`rank ${rank}: cannot recover its merge`);
    merges.push(parts.map((p) => bytesToLevel(Buffer.from(p, "latin1"))));
  }
  return merges;
}

function tokenizerJson({ vocab, merges, addedTokens, preTokenizer, ignoreMerges, postProcessor }) {
  return JSON.stringify({
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: addedTokens.map(([content, id]) => ({
      id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
    })),
    normalizer: null,
    pre_tokenizer: preTokenizer,
    post_processor: postProcessor,
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: ignoreMerges, vocab, merges,
    },
  });
}

// ---- Llama 2: llama-tokenizer-js ships the vocabulary and the ordered merges of Llama 2's Hugging Face
// conversion, not the tokenizer.model protobuf. SentencePiece BPE merges the adjacent pair whose merged piece has
// the highest score (ties leftmost), so a ModelProto whose piece scores follow merge order (score = -index of the
// first merge that makes the piece) encodes like the merge list. Pieces: <unk> UNKNOWN, <s> </s> CONTROL,
// <0x00>..<0xFF> BYTE, the rest NORMAL; trainer_spec: BPE, byte_fallback; normalizer_spec: identity,
// add_dummy_prefix, no whitespace removal, whitespace escaped to U+2581 (as in Llama 2's own model).
function writeSentencePieceModel(vocabById, mergeKeys) {
  const firstMerge = new Map();
  mergeKeys.forEach((k, i) => {
    const piece = k.replace(" ", "");
    if (!firstMerge.has(piece)) firstMerge.set(piece, i);
  });
  const varint = (v) => {
    const out = [];
    let n = BigInt.asUintN(64, BigInt(v));
    do {
      let b = Number(n & 0x7fn);
      n >>= 7n;
      if (n) b |= 0x80;
      out.push(b);
    } while (n);
    return Buffer.from(out);
  };
  const key = (field, wire) => varint((field << 3) | wire);
  const fieldVarint = (field, v) => Buffer.concat([key(field, 0), varint(v)]);
  const fieldBytes = (field, buf) => Buffer.concat([key(field, 2), varint(buf.length), buf]);
  const fieldFloat = (field, f) => {
    const b = Buffer.alloc(4);
    b.writeFloatLE(f);
    return Buffer.concat([key(field, 5), b]);
  };
  const parts = [];
  vocabById.forEach((piece, id) => {
    let type = 1;
    let score = 0;
    if (piece === "<unk>") type = 2;
    else if (piece === "<s>" || piece === "</s>") type = 3;
    else if (/^<0x[0-9A-F]{2}>$/.test(piece)) type = 6;
    else score = firstMerge.has(piece) ? -firstMerge.get(piece) : -1e6 - id;
    parts.push(fieldBytes(1, Buffer.concat([fieldBytes(1, Buffer.from(piece, "utf8")), fieldFloat(2, score),
                                            fieldVarint(3, type)])));
  });
  parts.push(fieldBytes(2, Buffer.concat([fieldVarint(3, 2), fieldVarint(4, vocabById.length), fieldVarint(35, 1),
                                          fieldVarint(40, 0), fieldVarint(41, 1), fieldVarint(42, 2)])));
  parts.push(fieldBytes(3, Buffer.concat([fieldBytes(1, Buffer.from("identity")), fieldVarint(3, 1),
                                          fieldVarint(4, 0), fieldVarint(5, 1)])));
  return Buffer.concat(parts);
}

export function writeTokenizerFiles(outDir) {
  for (const d of ["llama3", "gpt2", "llama2"]) fs.mkdirSync(path.join(outDir, d), { recursive: true });
  const write = (rel, data) => fs.writeFileSync(path.join(outDir, rel), data);
  for (const [name, data] of [["cl100k_base", cl100k], ["o200k_base", o200k], ["r50k_base", gpt2]]) {
    write(`${name}.tiktoken`, rankFile(tiktokenRanks(data)));
  }

  // GPT-2 as vocab.json + merges.txt and as a tokenizer.json with "a b" merges and the ByteLevel regex
  {
    const ranks = tiktokenRanks(gpt2);
    const vocab = Object.fromEntries(ranks.map(([bytes, rank]) => [bytesToLevel(bytes), rank]));
    vocab["<|endoftext|>"] = 50256;
    const merges = mergesFromRanks(ranks);
    write("gpt2/vocab.json", JSON.stringify(vocab));
    write("gpt2/merges.txt", "#version: 0.2\n" + merges.map((m) => m.join(" ") + "\n").join(""));
    write("gpt2/tokenizer.json", tokenizerJson({
      vocab, merges: merges.map((m) => m.join(" ")), addedTokens: [["<|endoftext|>", 50256]], ignoreMerges: false,
      preTokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
      postProcessor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    }));
  }

  // Llama 3: rank file, tokenizer.json (merges as pairs, ignore_merges)
  {
    const llama3Specials = llama3.vocabById.slice(128000);
    const base = llama3.vocabById.slice(0, 128000);
    write("llama3/tokenizer.model", base.map((s, id) => `${b64(levelToBytes(s))} ${id}\n`).join(""));
    const vocab = Object.fromEntries(base.map((s, id) => [s, id]));
    const merges = Array.from(llama3.merges.keys(), (k) => k.split(" "));
    const pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" +
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    write("llama3/tokenizer.json", tokenizerJson({
      vocab, merges, addedTokens: llama3Specials.map((s, i) => [s, 128000 + i]), ignoreMerges: true,
      preTokenizer: { type: "Sequence", pretokenizers: [
        { type: "Split", pattern: { Regex: pattern }, behavior: "Isolated", invert: false },
        { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
      postProcessor: { type: "Sequence", processors: [
        { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
        { type: "TemplateProcessing",
          single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
          pair: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
                 { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
          special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [128000], tokens: ["<|begin_of_text|>"] } } }] },
    }));
    write("llama3/tokenizer_config.json", JSON.stringify({ bos_token: "<|begin_of_text|>", eos_token: "<|end_of_text|>" }));
  }

  write("llama2/tokenizer.model", writeSentencePieceModel(llama2.vocabById, Array.from(llama2.merges.keys())));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [outDir] = process.argv.slice(2);
  if (!outDir) {
    console.error("usage: node vocab_files.mjs OUTDIR");
    process.exit(2);
  }
  writeTokenizerFiles(outDir);
}
