"""Regenerates unicode_stress.jsonl next to this file (one JSON string per line), deterministically.

    python tests/testdata/make_unicode_stress.py

Control, format, private-use and non-space whitespace characters are written as JSON escapes so
the file stays plain UTF-8 text.
"""

# ruff: noqa
import json, pathlib, random, unicodedata
from bertjax.data import unicode_tables as U

rng = random.Random(20181011)
L = []


def add(*xs):
    L.extend(xs)


# accents / decomposed / precomposed
add(
    "Café naïve résumé coöperate façade jalapeño São Paulo Zürich Ångström",
    "Cafe\u0301 nai\u0308ve re\u0301sume\u0301 (decomposed)",
    "Ǆemal ǅ ǆ ǈ ǋ Ǳ",
    "Tiếng Việt: Người ta thường nói rằng học, học nữa, học mãi.",
    "Ę̧̀ triple marks a\u0301\u0302\u0303\u0327 o\u0336\u0335 z\u0358\u035c",
    "ÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÐÑÒÓÔÕÖ×ØÙÚÛÜÝÞßàáâãäåæçèéêëìíîïðñòóôõö÷øùúûüýþÿ",
    "ĀāĂăĄąĆćĈĉĊċČčĎďĐđĒēĔĕĖėĘęĚěĜĝĞğĠġĢģĤĥĦħĨĩĪīĬĭĮįİıĲĳĴĵĶķĸĹĺĻļĽľĿŀŁł",
    "Straße STRASSE ß ẞ ŉ ǰ ΐ ΰ և ﬀ ﬁ ﬂ ﬃ ﬄ ﬅ ﬆ",
    "İstanbul ISTANBUL ıi Iı DİYARBAKIR",
    "ΣΊΣΥΦΟΣ σίσυφος ὈΔΥΣΣΕΎΣ Ὀδυσσεύς ᾼ ᾳ ῼ",
    "Zalgo: H̸̡̪̯ͨ͊̽̅̾̎Ȩ̬̩̾͛ͪ̈́̀́͘ ̶̧̨̱̹̭̯ͧ̾ͬC̷̙̲̝͖ͭ̏ͥͮ͟Oͮ͏̮̪̝͍M̲̖͊̒ͪͩͬ̚̚͜Ȇ̴̟̟͙̞ͩ͌͝S̨̥̫͎̭ͯ̿̔̀ͅ",
)
# CJK / Japanese / Korean
add(
    "中文字符测试：北京是中华人民共和国的首都。",
    "日本語のテキスト、カタカナとひらがな。東京タワー",
    "한국어 텍스트 테스트입니다. 서울특별시",
    "混合English和中文mixed文本123数字",
    "CJK ext: 𠀀𠀁𪜀𫝀𫠠𫠡𬺰 compat: 豈更車 丽丸乁",
    "半角ｶﾀｶﾅ 全角ＡＢＣ１２３！？",
    "ㄅㄆㄇ 〇〡〢 ㈱ ㍿ ⼀⼁⼂ ⺀⺁",
    "Hangul jamo: ᄀᄁᄂ ᅡᅢ ᆨᆩ and 각 깎",
)
# scripts
add(
    "Русский текст: Москва — столица России. ЁЖИК ёжик",
    "العربية: مرحبا بالعالم، كيف حالك؟ ١٢٣ ٫ ؛ ؟ ؝",
    "עברית: שָׁלוֹם עוֹלָם! בְּרֵאשִׁית",
    "हिन्दी: नमस्ते दुनिया। क़ ख़ ग़ ॐ ॥",
    "ไทย: สวัสดีชาวโลก ๑๒๓ ฯ ๏",
    "ગુજરાતી ਪੰਜਾਬੀ বাংলা தமிழ் తెలుగు ಕನ್ನಡ മലയാളം සිංහල",
    "Ελληνικά: Καλημέρα κόσμε; ·",
    "ქართული Հայերեն ᏣᎳᎩ ᚠᚢᚦ ᓀᐦᐃᔭᐍᐏᐣ ᙭ ᙮",
    "Tibetan: བོད་ཡིག ༄༅། ། Mongolian: ᠮᠣᠩᠭᠣᠯ\u180e᠋ ᠎",
    "Ethiopic: ሰላም ፡ ። ፣",
    "Khmer ខ្មែរ ។ ៕ Lao ລາວ ຯ",
)
# emoji
add(
    "emoji 😀😃😄😁 ❤️ 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇺🇸🇯🇵",
    "new emoji 🥲 🫠 🫶 🪿 🩷 🥰 🤩 🦩",
    "keycaps 1️⃣ #️⃣ *️⃣ ©️ ®️ ™️ ↔️",
    "smileys:) :-( <3 ^_^ ¯\\_(ツ)_/¯ (╯°□°）╯︵ ┻━┻",
)
# controls, whitespace, zero-width, NUL, replacement char
ws = "".join(
    chr(c)
    for c in [
        0x9,
        0xA0,
        0x1680,
        *range(0x2000, 0x200B),
        0x2028,
        0x2029,
        0x202F,
        0x205F,
        0x3000,
        0x85,
        0xB,
        0xC,
        0x1C,
        0x1D,
        0x1E,
        0x1F,
    ]
)
add(
    "whitespace:" + ws.join("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"),
    "zero\u200bwidth\u200cjoin\u200dner\u200e\u200f\u2060\ufeffbom\u2061\u2062\u2063\u2064",
    "nul\x00inside\x00\x00word and \x00 alone",
    "replacement \ufffd char\ufffdin\ufffd\ufffdwords",
    "controls \x01\x02\x03\x04\x05\x06\x07\x08 \x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x7f\x80\x81\x9f end",
    "tab\tseparated\tvalues\tand\rcarriage\rreturns",
    "soft\u00adhyphen and bidi \u202aembed\u202c \u202eoverride\u202c \u2066isolate\u2069",
    "private use \ue000\ue001\uf8ff \U000f0000\U0010fffd tags \U000e0001\U000e0041\U000e007f",
    "noncharacters \ufdd0\ufdef\ufffe\uffff \U0001fffe \U0010ffff",
    "variation selectors ︀︁︎️ \U000e0100 a\ufe0fb",
    "",
    "   ",
    "\t",
    "\x00",
    "\ufffd",
    "\u200b",
    "\u3000\u3000",
)
# long words
add(
    "a" * 100,
    "b" * 101,
    "é" * 100,
    "é" * 101,
    "é" * 60 + " cased bytes > 100 but chars < 100",
    "中" * 150,
    "x" * 99 + "é",
    "supercalifragilisticexpialidocious" * 3 + " short",
    "😀" * 101,
    "a\u0301" * 60,
    "https://example.com/" + "path/" * 30 + "?q=" + "v" * 120,
    "antidisestablishmentarianism" * 4,
    "ñ" * 50 + "n" * 50,
)
# punctuation
add(
    "ASCII !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ all",
    "Unicode: ¡¿«»‹›„“”‘’‚‐‑‒–—―…‰′″‴※‼⁇⁈⁉ ⸮ ⸘ · ¶ § † ‡ • ‣",
    "fullwidth：（）［］｛｝，。！？、〈〉《》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟 ＂＃％＆＇＊",
    "math ∀x∈ℝ: x²≥0 ⇒ √x² = |x| ± ∞ ≤ ≠ ≈ ∑∏∫ ½ ¼ ¾ ⅓ ⅔ ⁰¹²³⁴⁵⁶⁷⁸⁹ ₀₁₂",
    "symbols $ € £ ¥ ₹ ₿ © ® ™ ° µ Ω ℃ ℉ № ℗ ℠ Ⅰ Ⅱ Ⅻ ⅰ ⅱ 𝐀𝐁𝐂 𝒜 𝔄 𝕬 𝖠 𝙰",
    "email: john.doe+tag@example.co.uk; url: http://x.y/z?a=1&b=2#frag; path C:\\Users\\x",
    "code: def f(x): return x**2 + g[i][j] // 3 if x != 0 else {'k': v}",
    "numbers 3.14159 1,000,000 -42 +7 1e-10 0x1F 2024-01-01 12:30:45 98.6°F",
    "quotes 'single' \"double\" `back` ‘curly’ “curly” «guillemets» „low“",
    "dashes - – — ― ‐ ‑ ‒ ⁓ ~ 〜 ー",
)
# special tokens literally in text
add(
    "[CLS] sentence one [SEP] sentence two [SEP]",
    "fill the [MASK] here and [MASK][MASK] twice",
    "lowercase [mask] [cls] [sep] [pad] [unk] are plain text",
    "glued foo[MASK]bar[SEP]baz[PAD]qux[UNK]",
    "broken [MA\x00SK] [MASK [ MASK] [[MASK]] [MASK]]",
    "[unused0] [unused1] [UNUSED] [MASK ] [ CLS]",
    "[PAD][UNK][CLS][SEP][MASK]",
    "[MASK]",
    "x[CLS]",
    "[SEP]y",
)
# characters where TF's Unicode data differs from the reference's
for code, _ in U.LOWERCASE[::4]:
    add(f"newcase {chr(code)}{chr(code)}x X{chr(code)}")
for code in U.NFD_KEEP:
    add(f"newnfd a{chr(code)}b {chr(code)}\u0301")
add(
    "U+166D ᙭ U+061D ؝ U+0890 \u0890 U+2B820 \U0002b820 U+2B91F \U0002b91f U+2B920 \U0002b920 U+1734 a\u1734b"
)
# random lines: mixtures drawn from all planes, letters weighted
pools = [
    list(range(0x20, 0x7F)) * 4,
    list(range(0xA0, 0x250)),
    list(range(0x300, 0x370)),
    list(range(0x370, 0x530)),
    list(range(0x590, 0x800)),
    list(range(0x900, 0xE00)),
    list(range(0x1100, 0x1200)),
    list(range(0x1E00, 0x2000)),
    list(range(0x2000, 0x2C00)),
    list(range(0x3000, 0x3100)),
    list(range(0x4E00, 0x4F00)),
    list(range(0xAC00, 0xAD00)),
    list(range(0xFB00, 0xFFFE)),
    list(range(0x10000, 0x10400)),
    list(range(0x11000, 0x11400)),
    list(range(0x16000, 0x16E00)),
    list(range(0x1D400, 0x1D800)),
    list(range(0x1F300, 0x1FB00)),
    list(range(0x20000, 0x20100)),
    list(range(0x2B700, 0x2BA00)),
    list(range(0xE0000, 0xE0200)),
    list(range(0, 0x20)),
    [0x85, 0xA0, 0x2028, 0xFEFF, 0xFFFD, 0x200B, 0x180E, 0x115F, 0x3164],
]
pools = [[c for c in p if not 0xD800 <= c < 0xE000] for p in pools]
for i in range(400):
    n = rng.randint(1, 80)
    chars = []
    for _ in range(n):
        if rng.random() < 0.5:
            chars.append(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ      .,"))
        else:
            chars.append(chr(rng.choice(rng.choice(pools))))
    add("".join(chars).replace("\n", " "))


def esc(ch):
    c = ord(ch)
    if c > 0xFFFF:
        c -= 0x10000
        return "\\u%04x\\u%04x" % (0xD800 + (c >> 10), 0xDC00 + (c & 0x3FF))
    return "\\u%04x" % c


def dump(line):
    s = json.dumps(line, ensure_ascii=False)
    return "".join(
        esc(ch)
        if (
            unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cn", "Zl", "Zp")
            or (unicodedata.category(ch) == "Zs" and ch != " ")
        )
        else ch
        for ch in s
    )


with open(pathlib.Path(__file__).with_name("unicode_stress.jsonl"), "w", encoding="utf-8") as f:
    for line in L:
        assert "\n" not in line
        f.write(dump(line) + "\n")
print(len(L))
