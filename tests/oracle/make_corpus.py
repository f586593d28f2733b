#!/usr/bin/env python3
"""Writes the tokenizer test corpus (tests/data/tokenizer/corpus/*.txt).

The texts are written by hand below; long_document.txt and fuzz.txt are
derived deterministically (fixed seed). Files are written as UTF-8 bytes
exactly (CRLF kept where written).
"""
import os
import random
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "data", "tokenizer", "corpus")

TEXTS = {}

TEXTS["english"] = """The quick brown fox jumps over the lazy dog. It's 5 o'clock somewhere, isn't it?
We'll see what they've done; I'm sure you'd agree that it's fine. THEY'LL SAY IT'S OK, AREN'T THEY?
She said: "Don't do that!" -- and he didn't. Mixed case: It'S, wE'Ll, i'M, yOu'D, tHeY'rE, I'VE.
Long s contraction: it'ſ here. Curly quotes: it’s, don’t, “quoted”, ‘single’.
Hyphen-ated words, e.g., i.e., etc... and ellipsis… em—dash – en dash.
A sentence with   multiple   spaces, a trailing space 
and a line that ends with tabs\t\t
Price: $1,234.56 (approx. €1.234,56 or £999); 50% off! #hashtag @mention user_name snake_case CamelCase.
"""

TEXTS["code_python"] = '''#!/usr/bin/env python3
"""Docstring with 'quotes' and "double quotes"."""
import os, sys
from typing import Dict, List


class Tokenizer:
    def __init__(self, vocab: Dict[str, int], merges: List[tuple]) -> None:
        self.vocab = vocab
        self.ranks = {pair: i for i, pair in enumerate(merges)}

    def encode(self, text):
        if not text:
            return []
        ids = [self.vocab[c] for c in text if c in self.vocab]
        while len(ids) >= 2:
            best = min(zip(ids, ids[1:]), key=lambda p: self.ranks.get(p, 1e9))
            if best not in self.ranks:
                break
        return ids  # TODO(someone): handle   unknown chars


def main(argv=sys.argv[1:]):
    x = 0x1F600 + 3.14e-10 - 1_000_000
    s = f"{x!r:>10} and {{braces}} \\\\n \\t"
    print(s, end="\\n")
    return 0 if x else 1

if __name__ == "__main__":
    raise SystemExit(main())
'''

CODE_CRLF = """// C++ with Windows line endings\r
#include <vector>\r
#include <string>\r
\r
int add(int a, int b) {\r
\treturn a + b;  // tabs\r
}\r
\r
template <typename T>\r
std::vector<T> twice(const std::vector<T>& v) {\r
    std::vector<T> out;\r
    for (const auto& x : v) { out.push_back(x); out.push_back(x); }\r
    return out;\r
}\r
\r\r
\r
\r
function hello(name) {\r
  console.log(`Hello, ${name}!`);\r
  return name?.length ?? 0;\r
}\r
  \r
\t\r
SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son';\r
if (a != b && c <= d || !e) { x->y = z[0]; }\r
\r
"""
TEXTS["code_crlf"] = CODE_CRLF

TEXTS["cjk"] = """中文测试：今天天气很好，我们去公园散步吧。这是一个用于测试分词器的句子。
繁體中文：臺灣的夜市非常熱鬧，小吃種類繁多。
日本語のテキスト：吾輩は猫である。名前はまだ無い。カタカナとひらがな、そして漢字。
ｶﾀｶﾅ（半角）と全角ＡＢＣ１２３！？
한국어 문장입니다. 안녕하세요, 만나서 반갑습니다! 대한민국의 수도는 서울입니다.
混合: Hello世界, 123个苹果, AIモデル, 韓國語한국어.
《红楼梦》、「引用」、『二重引用』、【括弧】…………
𠀀𠀁𪚥 (CJK Extension B) 𰀀 (Extension G)
"""

TEXTS["scripts"] = """العربية: مرحبا بالعالم! هذه جملة باللغة العربية مع أرقام ١٢٣٤٥ وعلامات ترقيم؟
עברית: שלום עולם, זהו משפט בעברית.
हिन्दी: नमस्ते दुनिया! यह देवनागरी लिपि में एक वाक्य है। संख्याएँ: १२३४५
বাংলা: আমি বাংলায় গান গাই।
தமிழ்: வணக்கம் உலகம்
ไทย: สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ
Русский: Съешь же ещё этих мягких французских булок, да выпей чаю.
Ελληνικά: Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.
ქართული: გამარჯობა მსოფლიო
Հայերեն: Բարեւ աշխարհ
አማርኛ: ሰላም ዓለም
Tiếng Việt: Xin chào thế giới, đây là một câu tiếng Việt có dấu.
Türkçe: İstanbul'da ılık bir gün. Deutsch: Straße, Größe, ÄÖÜ. Français: œuvre, ça, naïve.
ᚠᚢᚦᚨᚱᚲ 𐌰𐌱𐌲 ꦧꦱꦗꦮ ᠮᠣᠩᠭᠣᠯ
"""

TEXTS["emoji"] = """Emoji: 😀😃😄 😁 🤖 🚀🔥 ❤️ ❤ ♥️ ✨ 👍 👍🏻 👍🏼 👍🏽 👍🏾 👍🏿
Families (ZWJ): 👨‍👩‍👧‍👦 👩‍👩‍👦 👨‍👨‍👧‍👧 🧑‍🤝‍🧑 👩🏽‍🤝‍👨🏿
Professions: 👩‍💻 👨🏾‍🚀 🧑🏼‍⚕️ 👮‍♀️ 🏃🏻‍♂️‍➡️
Flags: 🇫🇷 🇯🇵 🇺🇸 🇧🇷 🏳️‍🌈 🏴‍☠️ 🏴󠁧󠁢󠁳󠁣󠁴󠁿
Keycaps: 1️⃣ 2️⃣ #️⃣ *️⃣ 🔟
Text with emoji:I love🍕and🍺!Emoji at end😀
Hearts: 🧡💛💚💙💜🖤🤍🤎 ❣️ 💔 ❤️‍🔥 ❤️‍🩹
Symbols: ™ © ® ° ± × ÷ ∞ ≈ ≠ ≤ ≥ ∑ ∏ √ ∫ → ← ↑ ↓ ⇒ ★ ☆ ♠ ♣ ♦ ♪ ☕ ⌚
"""

TEXTS["combining"] = ("Decomposed (NFD) forms that NFC composes:\n"
    "e\u0301te\u0301 cafe\u0301 nai\u0308ve A\u030angstro\u0308m n\u0303 u\u0308ber\n"
    "Vietnamese stacked: Vie\u0323\u0302t Nam, tie\u0302\u0301ng Vie\u0323\u0302t\n"
    "Hangul jamo: \u1112\u1161\u11ab\u1100\u1173\u11af (decomposed) vs 한글\n"
    "Singletons: \u212b (angstrom sign) \u2126 (ohm sign) \u212a (kelvin) \u0340\u0341 \u0374 \u037e\n"
    "Canonical reordering: a\u0323\u0307 a\u0307\u0323 q\u0307\u0323 o\u031b\u0301\n"
    "Zalgo: Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349a\u0300\u0310l\u0357g\u0301o\u0328\n"
    "Devanagari nukta: \u0915\u093c \u0916\u093c \u0917\u093c (decomposed) vs \u0958\n"
    "Combining at start: \u0301abc \u0308 \u20dd \u20e3\n"
    "Already NFC: \u00e9t\u00e9 caf\u00e9 na\u00efve \u00c5ngstr\u00f6m\n")

TEXTS["special_tokens"] = """<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
What does <|endoftext|> mean?<|im_end|>
<|im_start|>assistant
<think>
Let me think about <|begin_of_text|> and <|eot_id|>.
</think>

It is a special token.<|im_end|><|endoftext|>
<|begin_of_text|><|start_header_id|>user<|end_header_id|>

Hello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>
Partial: <|im_start <|im_start|| <|im_start|>> <<|im_end|>> <|endoftext <|end_of_text|>text
Adjacent:<|im_end|><|im_end|>  <|im_end|>  spaced  <|endoftext|>\t<|endoftext|>
<tool_call>{"name": "f", "arguments": {}}</tool_call> <tool_response>ok</tool_response>
<|fim_prefix|>def f(<|fim_suffix|>):<|fim_middle|> <|reserved_special_token_5|> <|reserved_special_token_250|>
<|vision_start|><|image_pad|><|vision_end|> <|box_start|>(1,2)<|box_end|> <|finetune_right_pad_id|>
Not special: <|im_start|x> <im_start> |im_start| <|IM_START|>
"""

TEXTS["whitespace"] = ("Runs:  two   three    four     five      six       seven\n"
    "Tabs:\tone\t\ttwo\t\t\tthree\n"
    "\n\n\nthree newlines above\n\n\n\n\n\n\n\n\n\nten newlines above\n"
    "Mixed \t \t \t mix\n \n \n\t\n"
    "CR only\rline\r\r\rthree CR\n"
    "CRLF\r\n\r\n\r\nx\r\n"
    "Trailing spaces    \n    Leading spaces\n"
    "NBSP:\u00a0a\u00a0\u00a0b Ideographic:\u3000c\u3000\u3000d Thin:\u2009e Hair:\u200af\n"
    "Line sep:\u2028g Para sep:\u2029h NEL:\u0085i VT:\x0bj FF:\x0ck\n"
    "Mongolian vowel sep:\u180el ZWSP:\u200bm ZWNJ:\u200cn ZWJ:\u200do BOM:\ufeffp WJ:\u2060q\n"
    "Ogham space:\u1680r Narrow NBSP:\u202fs Medium math:\u205ft En quad:\u2000u\n"
    "Control chars: \x01\x02\x1b[0m \x7f end\n"
    "                                                                                \n"
    "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\n"
    " \n  \n   \n\n \t\n\u00a0\n"
    "word \n word\t\n\tword  \r\n  word")

TEXTS["numbers"] = """1 12 123 1234 12345 123456 1234567 12345678901234567890
3.14159 2.71828 -42 +7 1e10 6.022e23 0x7fffffff 0b1010 1_000_000 1,000,000
Dates: 2026-12-02 12/02/2026 02.12.2026 15:30:00
Phone: +1 (555) 123-4567, IP: 192.168.0.1, version v1.2.3-rc.4
Arabic-Indic: ٠١٢٣٤٥٦٧٨٩ Extended: ۰۱۲۳ Devanagari: ०१२३४५ Thai: ๐๑๒๓
Fullwidth: １２３４５ Superscripts: x² y³ ¹ Fractions: ½ ¼ ¾ ⅓ Roman: Ⅻ ⅻ Ⅳ Circled: ① ② ⑩
Mathematical: 𝟎𝟏𝟐 𝟙𝟚 Chinese numerals: 一二三 〇 Ethiopic: ፩፪፫
a1b2c3 abc123def 123abc 12.34.56 1..2 007 0.0000001
"""

TEXTS["markup"] = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Test &amp; check</title></head>
<body><p class="x">Hello <b>world</b>&nbsp;&lt;tag&gt;</p><!-- comment --></body></html>
{"key": "value", "list": [1, 2, 3], "nested": {"a": null, "b": true, "c": "\\u00e9"}}
# Markdown heading
- item one
- item **two** with `code` and [a link](https://example.com/path?q=1&r=2#frag)
> quote
```bash
$ ls -la ~/dir | grep -v '^d' && echo "done" >> /tmp/log 2>&1
```
LaTeX: $\\frac{a}{b} + \\sum_{i=0}^{n} x_i^2 = \\int_0^\\infty e^{-x}\\,dx$
URLs: http://a.b/c https://www.example.org/wiki/Ünïcödé mailto:someone@example.com
Punctuation runs: !!! ??? ... ,,, ;;; ::: --- ___ *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}
'quotes' "double" `back` 's 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D ''s '''t
"""

# For the fixture tokenizer with lstrip / rstrip / single_word / normalized
# added tokens (tests/data/tokenizer/fixtures/gen300_flags.json).
TEXTS["added_flags"] = ("a <mask> b   <mask>c\t[SEP]  d [SEP]\ne [SEP]\n\n  x\n"
    "hello world, sayhello hello_x hello! _hello (hello) hello\u0301 h\u00e9hello hello\n"
    "caf\u00e9 cafe\u0301 <both>  x  <both>\n\n<both> <mask><mask>  <mask>\n"
    "A\u030angstro\u0308m \u00c5ngstr\u00f6m\t<both>\u3000<both>\u00a0end <mask>")


def long_document(texts):
    rng = random.Random(1234)
    parts = []
    names = sorted(texts)
    size = 0
    while size < 100_000:
        name = rng.choice(names)
        lines = texts[name].split("\n")
        start = rng.randrange(len(lines))
        chunk = "\n".join(lines[start:start + rng.randint(1, 12)])
        sep = rng.choice(["\n", "\n\n", " ", "", "\r\n", "\t"])
        parts.append(chunk + sep)
        size += len((chunk + sep).encode("utf-8"))
    return "".join(parts)


def fuzz(seed=99, n=6000):
    rng = random.Random(seed)
    ranges = [
        (0x20, 0x7E, 40), (0x09, 0x0D, 4), (0xA0, 0x24F, 6), (0x300, 0x36F, 4),
        (0x370, 0x3FF, 2), (0x400, 0x4FF, 3), (0x590, 0x5FF, 2), (0x600, 0x6FF, 3),
        (0x900, 0x97F, 3), (0xE00, 0xE7F, 2), (0x1100, 0x11FF, 1), (0x2000, 0x206F, 3),
        (0x20A0, 0x20CF, 1), (0x2100, 0x218F, 2), (0x2190, 0x23FF, 1), (0x2460, 0x24FF, 1),
        (0x3000, 0x303F, 2), (0x3040, 0x30FF, 3), (0x4E00, 0x9FFF, 5), (0xAC00, 0xD7A3, 3),
        (0xFF00, 0xFFEF, 2), (0x1F300, 0x1F64F, 3), (0x1F900, 0x1F9FF, 1), (0x1F3FB, 0x1F3FF, 1),
        (0x200D, 0x200D, 1), (0xFE0F, 0xFE0F, 1),
    ]
    weights = [w for _, _, w in ranges]
    out = []
    words = ["<|im_start|>", "<|endoftext|>", "<|begin_of_text|>", "'s", "'LL", " ", "  ", "\n",
             "\r\n", "\t", "123", "the", " the", "e\u0301"]
    for _ in range(n):
        if rng.random() < 0.08:
            out.append(rng.choice(words))
            continue
        lo, hi, _ = rng.choices(ranges, weights)[0]
        cp = rng.randint(lo, hi)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        out.append(chr(cp))
    return "".join(out)


def unicode_sweep(lo, hi, per_line=32):
    """Every code point in [lo, hi) except surrogates and the line breaks,
    in lines of `per_line`, so tokenization of each script is exercised."""
    cps = [cp for cp in range(lo, hi)
           if not (0xD800 <= cp <= 0xDFFF) and cp not in (0x0A, 0x0D)]
    lines = ["".join(chr(c) for c in cps[i:i + per_line]) for i in range(0, len(cps), per_line)]
    return "\n".join(lines) + "\n"


SWEEPS = {
    "unicode_sweep_bmp1": [(0x0000, 0x4E00)],
    "unicode_sweep_bmp2": [(0x4E00, 0xA000)],
    "unicode_sweep_bmp3": [(0xA000, 0x10000)],
    "unicode_sweep_smp": [(0x10000, 0x10350), (0x1D400, 0x1D800), (0x1F000, 0x1FB00),
                          (0x20000, 0x20100), (0xE0000, 0xE0080)],
}


def main():
    os.makedirs(OUT, exist_ok=True)
    texts = dict(TEXTS)
    texts["long_document"] = long_document(TEXTS)
    texts["fuzz"] = fuzz()
    texts["nul_and_edges"] = "a\x00b\x00\x00 \x00\n<|im_end|>\x00<|im_end|>x" + "a" * 3000 + " " * 500 + "!" * 700 + "\n" * 300
    for name, ranges in SWEEPS.items():
        texts[name] = "".join(unicode_sweep(lo, hi) for lo, hi in ranges)
    for name, text in texts.items():
        with open(os.path.join(OUT, name + ".txt"), "wb") as f:
            f.write(text.encode("utf-8"))
    print(f"wrote {len(texts)} files to {OUT}")


if __name__ == "__main__":
    main()
