#!/usr/bin/env python3
"""Generate the tokenizer test corpus: tests/fixtures/tokenizer/corpus.jsonl (one JSON string per line).

    .venv/bin/python tools/make_tokenizer_corpus.py [--out FILE] [--seed N]

Deterministic (seeded). Covers: many scripts (Latin with diacritics, Cyrillic, Greek, CJK, kana,
Hangul, Arabic, Hebrew, Devanagari, Thai, rare scripts that need byte fallback), code, emoji incl.
ZWJ / skin-tone / flag / keycap sequences, runs of spaces / newlines / tabs / CRLF, control
characters, special-token strings (whole, partial, nested, repeated), very long inputs (10k+ chars),
and unusual but valid UTF-8 (noncharacters, private use, combining stacks, BOM, bidi marks,
variation selectors, plane-1..16 code points, U+2581 itself).
"""
import argparse
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.normpath(os.path.join(HERE, "..", "tests", "fixtures", "tokenizer", "corpus.jsonl"))

SENTENCES = [
    "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "Il était une fois une petite fille qui s'appelait Chloé.", "Größenwahn über Äpfel, Öl und Übermut — ß!",
    "¿Dónde está la biblioteca? ¡Allí, señor!", "Tiếng Việt có nhiều dấu thanh: à á ả ã ạ ă ắ ằ.",
    "Zażółć gęślą jaźń.", "Čeština: příliš žluťoučký kůň úpěl ďábelské ódy.", "Ångström, fjörd, Ærø, øl.",
    "Türkçe: ığüşöç İstanbul'da yağmur yağıyor.", "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.", "Україна, Київ — їжак і ґанок.",
    "Τάχιστη αλώπηξ βαφής ψημένη γη, δρασκελίζει υπέρ νωθρού κυνός.", "Ελληνικά: ἀρχὴ ἥμισυ παντός.",
    "我能吞下玻璃而不伤身体。", "天下大势，分久必合，合久必分。", "日本語のテキスト：ひらがな、カタカナ、漢字。",
    "すもももももももものうち", "한국어 문장입니다. 다람쥐 헌 쳇바퀴에 타고파.", "繁體中文與简体中文混合測試",
    "العربية: نص تجريبي باللغة العربية مع أرقام ١٢٣٤٥.", "مرحبا بالعالم! كيف حالك؟",
    "עברית: דג סקרן שט בים מאוכזב ולפתע מצא חברה.", "שלום עולם", "हिन्दी: ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले।",
    "नमस्ते दुनिया, आप कैसे हैं?", "ภาษาไทย: เป็นมนุษย์สุดประเสริฐเลิศคุณค่า", "สวัสดีชาวโลก",
    "Ქართული ენა: ქართული ანბანი", "Հայերեն լեզու", "ᚠᛇᚻ᛫ᛒᛦᚦ᛫ᚠᚱᚩᚠᚢᚱ᛫ᚠᛁᚱᚪ᛫ᚷᛖᚻᚹᛦᛚᚳᚢᛗ", "አማርኛ ቋንቋ",
    "বাংলা ভাষা", "தமிழ் மொழி", "తెలుగు భాష", "ಕನ್ನಡ ಭಾಷೆ", "മലയാളം", "ગુજરાતી", "ਪੰਜਾਬੀ", "සිංහල", "ລາວ", "ខ្មែរ", "မြန်မာ",
    "Монгол хэл", "ᠮᠣᠩᠭᠣᠯ", "ꦗꦮ", "ትግርኛ", "ᐃᓄᒃᑎᑐᑦ", "ⴰⵎⴰⵣⵉⵖ", "𐌰𐌱𐌲 Gothic", "𓀀𓀁𓀂 hieroglyphs",
    "𒀀𒀁 cuneiform", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝒮𝒸𝓇𝒾𝓅𝓉", "𠜎𠜱𠝹𠱓 CJK Ext-B", "Ḽơᶉëᶆ ȋṕšᶙṁ ḍỡḽǭᵳ",
]

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <iostream>\nint main() {\n\tstd::cout << \"hi\\n\";\n\treturn 0;\n}\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] * c[i]; }",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
    "<html>\n  <body>\n    <div class=\"x\"><p>Hi</p></div>\n  </body>\n</html>",
    "SELECT id, name FROM users WHERE age > 30 ORDER BY name DESC;",
    "const f = async (x) => { await g(x?.y ?? 0); };",
    "fn main() { let v: Vec<u8> = vec![0xff; 16]; println!(\"{:?}\", v); }",
    "$ ls -la | grep '^d' && echo \"done\" > /dev/null 2>&1",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares",
    "\\begin{equation} E = mc^2 \\end{equation}",
    "| a | b |\n|---|---|\n| 1 | 2 |", "```python\nprint('x')\n```",
    "https://example.com/path?query=1&b=%20#frag", "user@example.org", "C:\\Windows\\System32\\drivers",
    "0x7fffffff 1e-9 3.14159 -42 1,000,000 12:30:45 2026-11-29",
]

EMOJI = [
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵🇺🇸🇩🇪", "1️⃣#️⃣*️⃣", "❤️", "🧑🏿‍🚀", "👩‍❤️‍💋‍👨", "🐻‍❄️", "🫠🫶🪿",
    "☺︎ vs ☺️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "🤷‍♀️", "😶‍🌫️",
]

SPECIALS = [
    "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "[multimodal]",
    "<unused0>", "<unused99>", "<start_of_image>", "<end_of_image>", "<|turn>", "<turn|>", "<|think|>",
    "<start_of_tur", "<bos", "bos>", "<<bos>>", "</s>", "<s>", "<0x41>", "<0xZZ>", "<eos><eos>",
]

CONTROL = [chr(c) for c in list(range(0, 32)) + [127] + list(range(0x80, 0xA0))]

ODD = [
    "\ufeffBOM at start", "\ufffe\uffff", "\U0010ffff", "\ue000\uf8ff", "\U000f0000", "e\u0301\u0302\u0303\u0304",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349", "\u200e\u200f\u202a\u202e\u2066\u2069",
    "\u200b\u200c\u200d\u2060", "\ufe0e\ufe0f", "\u00a0\u2002\u2003\u2009\u3000", "\u2028\u2029", "\u0085",
    "a\u2581b", "\u2581", "\u2581\u2581 x", "ﬁ ﬂ ﬀ", "Ⅻ ⅻ ①②③", "℃ ℉ № ™", "ｆｕｌｌｗｉｄｔｈ", "ｶﾀｶﾅ",
    "\U0001d400\U0001d401", "\u0000\u0000", "tab\tinside", "\r\n\r\n", "trailing space ", " leading space",
]

SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\t\t", "    ", "\n\t", "\u3000", "\u00a0"]


def random_codepoint(rng):
    r = rng.random()
    if r < 0.35:
        return chr(rng.randint(0x20, 0x7E))
    if r < 0.55:
        return chr(rng.randint(0xA0, 0x2FFF))
    if r < 0.75:
        return chr(rng.randint(0x3000, 0xD7FF))
    if r < 0.85:
        return chr(rng.randint(0xE000, 0xFFFF))
    return chr(rng.randint(0x10000, 0x10FFFF))


def random_mix(rng, pools, n):
    parts = []
    for _ in range(n):
        pool = rng.choice(pools)
        parts.append(rng.choice(pool))
        if rng.random() < 0.6:
            parts.append(rng.choice(SPACES) if rng.random() < 0.3 else " ")
    return "".join(parts)


def words_of(texts):
    out = []
    for t in texts:
        out.extend(t.split())
    return out


def build(seed):
    rng = random.Random(seed)
    corpus = []
    add = corpus.append
    for group in (SENTENCES, CODE, EMOJI, SPECIALS, ODD, SPACES):
        for s in group:
            add(s)
    add("")
    for c in CONTROL:
        add(c)
        add("a" + c + "b")
    # special tokens inside text, with and without spaces around them
    for s in SPECIALS:
        add(f"{s}user\nHello{s}")
        add(f"text {s} more {s}{s}")
        add(f"<start_of_turn>user\n{rng.choice(SENTENCES)}<end_of_turn>\n<start_of_turn>model\n")
    # whitespace runs of every length
    for n in range(1, 41):
        add(" " * n)
        add("\n" * n)
        add("\t" * n)
        add("a" + " " * n + "b")
        add("x" + "\n" * (n % 7 + 1) + " " * (n % 5) + "y")
    for _ in range(60):
        add("".join(rng.choice(SPACES) for _ in range(rng.randint(1, 12))))
    # numbers
    for _ in range(60):
        add(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 12))) for _ in range(rng.randint(1, 6))))
    # mixes of words from several scripts
    words = words_of(SENTENCES + CODE)
    pools = [words, EMOJI, SPECIALS, CONTROL, ODD, [c for s in SENTENCES for c in s]]
    for _ in range(700):
        add(random_mix(rng, pools, rng.randint(1, 25)))
    # random code points from all planes
    for _ in range(500):
        add("".join(random_codepoint(rng) for _ in range(rng.randint(1, 40))))
    # sentence recombinations per script
    for _ in range(300):
        k = rng.randint(1, 4)
        add(rng.choice(["", " ", "\n"]).join(rng.choice(SENTENCES) for _ in range(k)))
    # code with indentation variants
    for _ in range(150):
        s = rng.choice(CODE)
        if rng.random() < 0.5:
            s = s.replace("    ", "\t")
        if rng.random() < 0.3:
            s = s.replace("\n", "\r\n")
        add(s * rng.randint(1, 3))
    # emoji sequences
    for _ in range(150):
        add("".join(rng.choice(EMOJI + [" ", "a", "!"]) for _ in range(rng.randint(1, 12))))
    # very long inputs (10k+ chars)
    add(" ".join(rng.choice(words) for _ in range(3000)))        # mixed scripts, ~20k chars
    add("a" * 12000)
    add(" " * 10001)
    add("\n" * 10001)
    add(("😀👨‍👩‍👧" * 1500))
    add("".join(random_codepoint(rng) for _ in range(10000)))
    add(("<start_of_turn>user\nhi<end_of_turn>\n" * 300))
    add("".join(rng.choice(SENTENCES) + rng.choice(SPACES) for _ in range(250)))
    return corpus


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=20261129)
    a = ap.parse_args()
    corpus = build(a.seed)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w", encoding="utf-8", newline="\n") as f:
        for s in corpus:
            f.write(json.dumps(s, ensure_ascii=True) + "\n")
    print(f"{a.out}: {len(corpus)} strings, {os.path.getsize(a.out)} bytes")


if __name__ == "__main__":
    main()
