// The varied half of the parity corpus: documents generated from a fixed seed, so every run and every machine
// sees the same text. Each document mixes fragments that stress different parts of a tokenizer: many Unicode
// scripts, combining marks, emoji sequences, digit runs, whitespace runs (tabs, CRLF, NBSP, ideographic space),
// source code, contractions in every case, punctuation runs and the literal text of special tokens.
// Left out on purpose: U+0085 (NEL) and U+FEFF, where JavaScript's \s differs from Unicode White_Space, so the
// npm ports split differently from the Rust tiktoken and Hugging Face tokenizers they port (docs/tokenizers.md).

// mulberry32: a small deterministic PRNG (Math.random has no seed).
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const prose = [
  "The quick brown fox jumps over the lazy dog.",
  "I'm sure you'll like it; they've said it's the best they'd ever seen.",
  "DON'T SHOUT! I'LL HEAR YOU. WE'RE HERE. SHE'S GONE. THEY'VE LEFT. HE'D KNOW.",
  "Don'T mIx CaSeS'Ll 'S 'T 'Re 'Ve 'M 'Ll 'D — it’s curly, isn’t it? rock 'n' roll, y'all.",
  "McDonald's iPhone HTTPServer XMLHttpRequest getElementById snake_case_name SCREAMING_CASE camelCaseWord",
  "Le cœur a ses raisons que la raison ne connaît point. « Où est-il ? » demanda-t-elle.",
  "Größere Übungen fördern Äpfel und Öl; der Straßenbahnhaltestellenschild­wechsel ist schwierig.",
  "¿Dónde está el niño? ¡Mañana será otro día! La cigüeña voló sobre el pingüino.",
  "Zażółć gęślą jaźń. Příliš žluťoučký kůň úpěl ďábelské ódy. İstanbul'da ılık bir gün.",
  "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "Жебракують філософи при ґанку церкви в Гадячі. Ѳ ѣ і ѵ — старая орфография.",
  "صِف خَلقَ خَودِ كَمِثلِ الشَمسِ إِذ بَزَغَت. مرحبا بالعالم! ١٢٣٤٥٦٧٨٩٠",
  "דג סקרן שט בים מאוכזב ולפתע מצא חברה. שלום עולם",
  "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम।",
  "আমি বাংলায় গান গাই। தமிழ் மொழி அழகானது. తెలుగు భాష. ಕನ್ನಡ ನುಡಿ. മലയാളം.",
  "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน",
  "我能吞下玻璃而不伤身体。我能吞下玻璃而不傷身體。中华人民共和国成立于1949年。",
  "いろはにほへと ちりぬるを わかよたれそ つねならむ。カタカナとひらがなと漢字。ｶﾀｶﾅ",
  "다람쥐 헌 쳇바퀴에 타고파. 키스의 고유조건은 입술끼리 만나야 하고 특별한 기술은 필요치 않다.",
  "Tiếng Việt có dấu: Người ta thường nói rằng học, học nữa, học mãi. Ðđ Ơơ Ưư",
  "ქართული ენა. Հայերեն լեզու. ሰላም ለዓለም. Ⴀⴁⴂ ᚠᚢᚦᚨᚱᚲ ᛁᛃ",
  "Zalgo: Z̵̢̛a̷͎̓l̸̰̈́g̶̣̈o̴͙̿ t̷e̵x̶t̴ — e\u0301 a\u0308 o\u0302 n\u0303 (decomposed accents)",
  "Math: ∑ᵢ xᵢ² ≤ ∫₀^∞ e^{-x} dx ≠ √2 ≈ 1.41421356; ∀x∈ℝ ∃y: x<y. π≈3.14159, ℏ, ∂f/∂x, ⅓ + ⅔ = 1",
  "Money: €1,234.56 £99 ¥10000 ₹2,50,000 ₿0.0042 $3.50 ¢50 ₩5000 ₽300",
  "Numbers: 0 7 42 123 1234 12345 123456789012345678901234567890 3.14159265358979 -0.001 1e-9 6.02214076e23",
  "Dates 2024-03-15T12:34:56Z, 15/03/2024, March 15th, 1999; phone +1 (555) 123-4567; ISBN 978-3-16-148410-0",
  "Digits in scripts: ٠١٢٣٤٥٦٧٨٩ ०१२३४५६७८९ ০১২৩ ０１２３４５６７８９ ² ³ ¹ ¼ ½ Ⅻ ⅻ ① ② ③",
  "Punctuation runs!!! ??? ?!?! ... …… --- ––– ——— *** ### @@@ &&& ||| /// \\\\\\ <<< >>> ((())) [[[]]] {{{}}}",
  "Quotes: \"double\" 'single' “curly” ‘curly’ „German“ «French» 「Japanese」 『nested』 ‹single›",
  "Special token text stays text: <|endoftext|> <|begin_of_text|> <|eot_id|> <s> </s> <unk> <|im_start|>",
  "URLs: https://example.com/path/to/page?query=1&x=%20y#frag http://127.0.0.1:8080/ mailto:a.b@c.org",
  "Emoji: 😀😃😄 🎉🎊 👍🏽👍🏿 👨‍👩‍👧‍👦 🇫🇷🇯🇵🇺🇸 🏳️‍🌈 ❤️‍🔥 ✅❌ 🧑🏻‍💻 🤷‍♀️ 🐍🦀☕ 1️⃣2️⃣ ©️®️™️",
  "Box drawing ┌─┬─┐ │a│b│ └─┴─┘ ░▒▓█ ▲▼◆● ♠♣♥♦ ♩♪♫♬ ☀☁☂☃ ⚡⚽⛄",
];

const code = [
  "#include <vector>\nint main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x *= 2;\n  return v.size() > 2 ? 0 : 1;\n}\n",
  "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nif __name__ == '__main__':\n    print(fib(30))\n",
  "{\n  \"name\": \"primus\",\n  \"version\": \"0.1.0\",\n  \"tags\": [\"llm\", \"training\"],\n  \"nested\": {\"a\": null, \"b\": true, \"c\": -1.5e+3}\n}\n",
  "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Test &amp; more</title></head>\n<body><p class=\"x\">Hello&nbsp;world</p></body>\n</html>\n",
  "$ cat /etc/os-release | grep -E '^(NAME|VERSION)=' && echo \"ok\" >> /tmp/log.txt 2>&1\n$ ls -la ~/.config/\n",
  "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total > 100.00 GROUP BY u.id HAVING n >= 3;\n",
  "fn main() {\n\tlet xs: Vec<u64> = (1..=10).map(|x| x * x).collect();\n\tprintln!(\"{:?}\", xs);\n}\n",
  "| col A | col B |\n|------:|:------|\n| 1     | `x`   |\n| 22    | **y** |\n",
  "const re = /^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@example\\.com$/i;\nlet s = `template ${a + b} literal`;\n",
  "\tif (x) {\r\n\t\treturn y;\r\n\t}\r\n\telse\r\n\t{\r\n\t\tthrow new Error(\"CRLF code\");\r\n\t}\r\n",
];

const whitespace = [
  " ", "  ", "   ", "    ", "        ", "                                        ",
  "\t", "\t\t", "\t\t\t\t", " \t ", "\n", "\n\n", "\n\n\n\n", "\r\n", "\r\n\r\n", "\r", " \n", "  \n  ",
  "\u00a0", "\u00a0\u00a0", "\u2003", "\u3000", "\u3000\u3000", "\u2028", "\u2029", "\u000b", "\u000c", " \u00a0 ",
  "\u200b", "\u2009", "\u202f",
];

function randomDigits(next) {
  const len = 1 + Math.floor(next() * 25);
  let s = "";
  for (let i = 0; i < len; i++) s += String.fromCharCode(48 + Math.floor(next() * 10));
  return s;
}

function randomWordSoup(next) {
  // Random letters from several blocks, so that BPE meets pieces that are not whole tokens.
  const blocks = [[0x61, 26], [0x41, 26], [0xe0, 31], [0x3b1, 25], [0x430, 32], [0x5d0, 27], [0x4e00, 2000],
                  [0xac00, 500], [0x3041, 80], [0x905, 40], [0x1f600, 60]];
  const [base, span] = blocks[Math.floor(next() * blocks.length)];
  const len = 1 + Math.floor(next() * 12);
  let s = "";
  for (let i = 0; i < len; i++) s += String.fromCodePoint(base + Math.floor(next() * span));
  return s;
}

export function variedDocuments(seed, count) {
  const next = rng(seed);
  const pick = (list) => list[Math.floor(next() * list.length)];
  const docs = [];
  for (let d = 0; d < count; d++) {
    const parts = [];
    const n = 8 + Math.floor(next() * 30);
    for (let i = 0; i < n; i++) {
      const r = next();
      if (r < 0.45) parts.push(pick(prose));
      else if (r < 0.6) parts.push(pick(code));
      else if (r < 0.75) parts.push(randomDigits(next));
      else if (r < 0.88) parts.push(randomWordSoup(next));
      else parts.push(pick(whitespace).repeat(1 + Math.floor(next() * 4)));
      parts.push(next() < 0.7 ? " " : pick(whitespace));
    }
    let text = parts.join("");
    if (next() < 0.2) text = text.replace(/\n/g, "\r\n");
    docs.push(text);
  }
  return docs;
}

// Documents that contain special-token text, for the encode-with-specials comparison.
export function specialDocuments(seed, count, specials) {
  const next = rng(seed);
  const docs = [];
  for (let d = 0; d < count; d++) {
    const parts = [];
    const n = 3 + Math.floor(next() * 8);
    for (let i = 0; i < n; i++) {
      parts.push(prose[Math.floor(next() * prose.length)].replace(/<\|[^|]*\|>|<\/?s>|<unk>/g, ""));
      parts.push(next() < 0.5 ? specials[Math.floor(next() * specials.length)] : " ");
    }
    docs.push(parts.join(""));
  }
  return docs;
}

// tinyshakespeare cut into documents of a few kilobytes at blank lines.
export function shakespeareDocuments(text, targetChars) {
  const docs = [];
  let current = "";
  for (const para of text.split(/(?<=\n\n)/)) {
    current += para;
    if (current.length >= targetChars) {
      docs.push(current);
      current = "";
    }
  }
  if (current.length) docs.push(current);
  return docs;
}
