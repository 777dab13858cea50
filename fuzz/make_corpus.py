#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/corpus/ (docs/fuzzing.md): small valid files of each format, written by hand
after FORMATS.md, plus a few near misses. Run it from the repository root; it replaces fuzz/corpus/."""
import base64
import json
import os
import shutil
import struct

SEP = b"\n@@\n"  # fuzz_input.h: kSeparator
ROOT = "fuzz/corpus"


def put(target, name, data):
    os.makedirs(f"{ROOT}/{target}", exist_ok=True)
    with open(f"{ROOT}/{target}/{name}", "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# --- config: YAML \n@@\n overrides (no '/' or '\': the harness skips those) ---
EXPERIMENT = """work_group: ${PRIMUS_TEAM:amd}
user_name: fuzz
exp_name: seed
workspace: output
modules:
  pre_trainer:
    framework: megatron
    model: tiny_llama
    overrides:
      train_iters: ${FUZZ_ITERS}
      micro_batch_size: 2
      global_batch_size: 8
      seq_length: 32
      lr: 3.0e-3
      min_lr: 3.0e-4
      lr_warmup_iters: 2
      lr_decay_style: cosine
      weight_decay: 0.1
      data_path: [fortunes_text_document]
      tokenizer_type: GPT2BPETokenizer
      tokenizer_model: gpt2
      split: "969,30,1"
      sample_prompt: "The meaning of life is"
"""
put("config", "experiment.yaml", EXPERIMENT)
put("config", "extends_overrides", "extends: base.yaml\nexp_name: child\nmodules:\n  pre_trainer:\n    overrides:\n"
    "      lr: 2.0e-3\n" + SEP.decode() + "train_iters=12\n--lr=1e-4\nexp_name=over\n"
    "modules.pre_trainer.overrides.seq_length=64\ndata_path=[a, b]\nsplit=\"98,1,1\"\n")
put("config", "extends_list", "extends: [base.yaml, ${FUZZ_BASE}]\nmodules:\n  pre_trainer:\n    model: qwen3_0.6B\n")
put("config", "anchors", "extends: base.yaml\ndefaults: &d\n  lr: 1.0e-3\n  seed: 7\nmodules:\n  pre_trainer:\n"
    "    overrides:\n      <<: *d\n      train_iters: 3\n")
put("config", "slurm_container", "extends: base.yaml\nslurm:\n  nodes: 2\n  gpus_per_node: 8\n  time: \"1-00:00:00\"\n"
    "  partition: gpu\ncontainer:\n  image: primus\n  options:\n    env:\n      HF_TOKEN: secret\n")
put("config", "self_cycle", "extends: exp.yaml\n")
put("config", "bad_override", "extends: base.yaml\n" + SEP.decode() + "novalue\n.a=1\nextends=x\nlr=[1,\n")

# --- safetensors: a mode byte (0 file, 1 HF folder, 2 sharded checkpoint), then the parts ---
def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, bytes)] -> the file, laid out as the reference writer does."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + data


f32 = lambda *v: struct.pack(f"<{len(v)}f", *v)
bf16 = lambda *v: b"".join(struct.pack("<f", x)[2:] for x in v)
f16 = lambda *v: struct.pack(f"<{len(v)}e", *v)
MODEL = safetensors([("w", "F32", [2, 2], f32(1, 2, 3, 4)), ("b", "BF16", [3], bf16(0.5, -1, 2)),
                     ("h", "F16", [2], f16(1.5, -0.25)), ("i", "I32", [1], struct.pack("<i", 7)),
                     ("e", "F32", [0, 4], b""), ("u", "U8", [2], b"\x01\x02"), ("d", "F64", [1], struct.pack("<d", 1))],
                    {"format": "pt"})
put("safetensors", "file", b"\x00" + MODEL)
put("safetensors", "file_scalar", b"\x00" + safetensors([("s", "F32", [], f32(3))]))
put("safetensors", "hf_folder", b"\x01" + json.dumps(
    {"metadata": {"total_size": 24}, "weight_map": {"w": "a.safetensors", "b": "a.safetensors", "c": "b.safetensors"}}
).encode() + SEP + safetensors([("w", "F32", [2, 2], f32(1, 2, 3, 4)), ("b", "BF16", [2], bf16(1, 2))]) + SEP
    + safetensors([("c", "F16", [2], f16(1, 2))]))
put("safetensors", "sharded", b"\x02" + json.dumps({"format": "primus-sharded-checkpoint", "world_size": 2, "tensors": {
    "w": [{"file": "shard_0_of_2.safetensors", "key": "w.0", "shape": [2, 3], "slice": [0, 4], "dtype": "F32"},
          {"file": "shard_1_of_2.safetensors", "key": "w.1", "shape": [2, 3], "slice": [4, 6], "dtype": "F32"}],
    "m": [{"file": "shard_1_of_2.safetensors", "key": "m", "shape": [2], "slice": [0, 2], "dtype": "BF16"}]}}).encode()
    + SEP + safetensors([("w.0", "F32", [4], f32(1, 2, 3, 4))]) + SEP
    + safetensors([("w.1", "F32", [2], f32(5, 6)), ("m", "BF16", [2], bf16(1, 2))]))
# Tensor-parallel pieces: column boxes of a [2, 4] tensor, one cut inside a row, and a row box.
put("safetensors", "sharded_boxes", b"\x02" + json.dumps({"format": "primus-sharded-checkpoint", "world_size": 2,
                                                          "tensors": {
    "w": [{"file": "shard_0_of_2.safetensors", "key": "w", "shape": [2, 4],
           "box": {"offset": [0, 0], "shape": [2, 2]}, "slice": [0, 4], "dtype": "F32"},
          {"file": "shard_1_of_2.safetensors", "key": "w@0", "shape": [2, 4],
           "box": {"offset": [0, 2], "shape": [2, 2]}, "slice": [0, 1], "dtype": "F32"},
          {"file": "shard_1_of_2.safetensors", "key": "w@1", "shape": [2, 4],
           "box": {"offset": [0, 2], "shape": [2, 2]}, "slice": [1, 4], "dtype": "F32"}],
    "e": [{"file": "shard_0_of_2.safetensors", "key": "e", "shape": [4, 2],
           "box": {"offset": [0, 0], "shape": [2, 2]}, "slice": [0, 4], "dtype": "F32"},
          {"file": "shard_1_of_2.safetensors", "key": "e", "shape": [4, 2],
           "box": {"offset": [2, 0], "shape": [2, 2]}, "slice": [0, 4], "dtype": "F32"}]}}).encode()
    + SEP + safetensors([("w", "F32", [4], f32(1, 2, 5, 6)), ("e", "F32", [4], f32(1, 2, 3, 4))]) + SEP
    + safetensors([("w@0", "F32", [1], f32(3)), ("w@1", "F32", [3], f32(4, 7, 8)), ("e", "F32", [4], f32(5, 6, 7, 8))]))

# --- indexed_dataset: .idx \n@@\n .bin (Megatron's MMIDIDX version 1) ---
def idx(code, lengths, docs, itemsize, modes=None):
    out = b"MMIDIDX\x00\x00" + struct.pack("<QB", 1, code) + struct.pack("<QQ", len(lengths), len(docs))
    out += struct.pack(f"<{len(lengths)}i", *lengths)
    pointers, at = [], 0
    for n in lengths:
        pointers.append(at)
        at += n * itemsize
    out += struct.pack(f"<{len(pointers)}q", *pointers) + struct.pack(f"<{len(docs)}q", *docs)
    return out + (bytes(modes) if modes is not None else b"")


put("indexed_dataset", "u16", idx(8, [3, 0, 2], [0, 1, 3], 2) + SEP + struct.pack("<5H", 1, 2, 3, 50256, 0))
put("indexed_dataset", "i32", idx(4, [2, 1], [0, 2], 4) + SEP + struct.pack("<3i", 7, 100000, -1))
put("indexed_dataset", "i64", idx(5, [2], [0, 1], 8) + SEP + struct.pack("<2q", 5, 1 << 40))
put("indexed_dataset", "u8_multimodal", idx(1, [1, 2], [0, 1, 2], 1, modes=[0, 1]) + SEP + b"\x01\x02\x03")
put("indexed_dataset", "empty", idx(8, [], [0], 2) + SEP)

# --- tokenizer: a mode byte (0 tokenizer.json, 1 vocab.json + merges.txt, 2 tiktoken), then the parts ---
def byte_level(data):
    """GPT-2's bytes_to_unicode spelling of `data`."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return "".join(table[b] for b in data)


MERGES = [(b"h", b"e"), (b"l", b"l"), (b"he", b"ll"), (b"hell", b"o"), (b" ", b"w"), (b"\xc3", b"\xa9")]
VOCAB = {byte_level(bytes([b])): b for b in range(256)}
for i, (a, b) in enumerate(MERGES):
    VOCAB[byte_level(a + b)] = 256 + i
MERGE_LIST = [[byte_level(a), byte_level(b)] for a, b in MERGES]
TEXT = "hello world <|endoftext|> caf\u00e9 [tool] 12345   \n\ttabs".encode()
SPLIT = {"type": "Split", "pattern": {"Regex": r" ?\p{L}+| ?\p{N}+|\s+(?!\S)|\s+|[^\s\p{L}\p{N}]+"},
         "behavior": "Isolated", "invert": False}
HF = {"version": "1.0",
      "added_tokens": [{"id": 300, "content": "<|endoftext|>", "special": True},
                       {"id": 301, "content": "[tool]", "special": False, "lstrip": True, "rstrip": False,
                        "single_word": True}],
      "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]},
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
          SPLIT, {"type": "Digits", "individual_digits": True},
          {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]},
      "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>"}},
                                                                   {"Sequence": {"id": "A"}}]},
      "decoder": {"type": "ByteLevel"},
      "model": {"type": "BPE", "vocab": VOCAB, "merges": MERGE_LIST, "ignore_merges": False}}
put("tokenizer", "hf", b"\x00" + json.dumps(HF).encode() + SEP + TEXT + SEP
    + b'{"eos_token": {"content": "[tool]"}, "bos_token": "<|endoftext|>"}')
HF_GPT2 = dict(HF, normalizer=None, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True, "use_regex": True},
               model=dict(HF["model"], merges=[" ".join(m) for m in MERGE_LIST]))
del HF_GPT2["post_processor"]
put("tokenizer", "hf_bytelevel", b"\x00" + json.dumps(HF_GPT2).encode() + SEP + TEXT)
GPT2_VOCAB = dict(VOCAB, **{"<|endoftext|>": 256 + len(MERGES)})
put("tokenizer", "gpt2", b"\x01" + json.dumps(GPT2_VOCAB).encode() + SEP
    + ("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGE_LIST)).encode() + SEP + TEXT)
RANKS = [bytes([b]) for b in range(256)] + [b"  ", b" x", b"00", b"he", b"ll"]
put("tokenizer", "tiktoken", b"\x02" + b"".join(base64.b64encode(t) + b" %d\n" % r for r, t in enumerate(RANKS))
    + SEP + TEXT)

# --- report: metrics.jsonl \n@@\n config.yaml \n@@\n logs/train.log ---
METRICS = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in [
    {"step": 2, "loss": 5.5, "lr": 0.001, "grad_norm": 1.5, "tokens_per_s": 1000, "tflops_per_gpu": 0.5,
     "step_ms": 10, "mfu": 0.1, "mem_peak_gib": 1.5},
    {"step": 4, "loss": 4.5, "lr": 0.002, "grad_norm": 1.2, "tokens_per_s": None, "step_ms": 9, "eval_loss": 4.25},
    {"step": 3, "loss": 5.0, "lr": 0.0015, "note": "x"}]) + '{"step":6,"loss":4'
CONFIG = """exp_name: "seed<run>"
workspace: ./ws
modules:
  pre_trainer:
    framework: megatron
    overrides:
      num_layers: 2
      hidden_size: 64
      train_iters: 10
      micro_batch_size: 2
      global_batch_size: 8
      lr: 0.002
      data_path: [a, b]
"""
LOG = """[2026-01-31 12:00:00.001] [primus] [info] device: cpu (2 OpenMP threads)
[2026-01-31 12:00:00.002] [primus] [info] model: 2 layers, hidden 64, 141632 parameters
[2026-01-31 12:00:00.003] [primus] [info] data: 1000 samples
[2026-01-31 12:00:02.000] [primus] [info] done: 10 iterations in 2.0 s; run directory ./ws/run
"""
put("report", "run", METRICS + SEP.decode() + CONFIG + SEP.decode() + LOG)
put("report", "metrics_only", METRICS.rsplit("\n", 1)[0] + "\n")
