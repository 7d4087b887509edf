"""Regenerates ``bertjax/data/unicode_tables.py`` from the reference tokenizer (a few minutes).

    python tests/testdata/make_unicode_tables.py > bertjax/data/unicode_tables.py

Measures, one code point at a time, how HuggingFace's ``BertNormalizer`` + ``BertPreTokenizer``
(the reference of ``BertTokenizerFast``) classify every character, and where TensorFlow's own
uncased normalisation differs from it. Needs the ``test`` extra (``tokenizers``).
"""

import pathlib

from bertjax.data import tokenization, unicode_tables


def _measure() -> dict[str, list[int]]:
    """Classifies every code point with the reference (slow: about a minute)."""
    from tokenizers import normalizers, pre_tokenizers

    cased = normalizers.BertNormalizer(lowercase=False)
    uncased = normalizers.BertNormalizer(lowercase=True)
    split = pre_tokenizers.BertPreTokenizer()
    classes = {"DROP": [], "SPACE": [], "CJK": [], "NONSPACING_MARK": [], "PUNCT": []}
    for code in range(0x110000):
        if 0xD800 <= code < 0xE000:  # surrogates cannot occur in UTF-8 text
            continue
        char = chr(code)
        text = f"a{char}b"
        normalized = cased.normalize_str(text)
        if normalized == "ab":
            classes["DROP"].append(code)
        elif normalized == "a b":
            classes["SPACE"].append(code)
        elif normalized == f"a {char} b":
            classes["CJK"].append(code)
        elif uncased.normalize_str(text) == "ab":
            classes["NONSPACING_MARK"].append(code)
        if [w for w, _ in split.pre_tokenize_str(text)] == ["a", char, "b"]:
            classes["PUNCT"].append(code)
    return classes


def _source_lines(name: str, codes: list[int]) -> list[str]:
    spans: list[list[int]] = []
    for code in codes:
        if spans and spans[-1][1] == code - 1:
            spans[-1][1] = code
        else:
            spans.append([code, code])
    parts = [f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in spans]
    chunks, current = [], ""
    for part in parts:
        if len(current) + len(part) > 88:
            chunks.append(current)
            current = ""
        current += part
    chunks.append(current)
    return [f"{name} = (", *(f'    r"{c}"' for c in chunks), ")"]


def _measure_uncased_fixups() -> tuple[list[tuple[int, int]], list[int]]:
    """(LOWERCASE, NFD_KEEP): where TensorFlow's uncased normalisation differs."""
    import tensorflow as tf
    import tensorflow_text as tf_text
    from tokenizers import normalizers, pre_tokenizers

    uncased = normalizers.BertNormalizer(lowercase=True)
    split = pre_tokenizers.BertPreTokenizer()
    codes = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    texts = [f"a{chr(c)}b" for c in codes]
    normalized = tokenization.bert_normalize(tf.constant(texts), True, fixups=False)
    ours = tokenization.split_words(normalized).to_list()
    lowercase, nfd_keep = [], []
    for code, text, mine in zip(codes, texts, ours, strict=True):
        ref = [w for w, _ in split.pre_tokenize_str(uncased.normalize_str(text))]
        if ref == [w.decode("utf-8") for w in mine]:
            continue
        if len(ref) != 1 or len(ref[0]) != 3:
            raise ValueError(f"U+{code:04X}: reference gives {ref!r}, not one character")
        if tf_text.normalize_utf8(chr(code), "NFD").numpy().decode("utf-8") != chr(code):
            if ref[0][1] != chr(code):
                raise ValueError(f"U+{code:04X}: kept by the reference's NFD but changed")
            nfd_keep.append(code)
        else:
            lowercase.append((code, ord(ref[0][1])))
    return lowercase, nfd_keep


def _items_lines(name: str, items: list[str]) -> list[str]:
    lines, current = [], "   "
    for item in items:
        if len(current) + len(item) + 2 > 96:
            lines.append(current)
            current = "   "
        current += f" {item},"
    return [f"{name} = (", *lines, current, ")"]


if __name__ == "__main__":
    tables = pathlib.Path(unicode_tables.__file__).read_text()
    header = tables.split("# fmt: off\n")[0]
    lines = [header + "# fmt: off"]
    for class_name, class_codes in _measure().items():
        lines += _source_lines(class_name, class_codes)
    lowercase_pairs, nfd_codes = _measure_uncased_fixups()
    lines += _items_lines("LOWERCASE", [f"(0x{a:X}, 0x{b:X})" for a, b in lowercase_pairs])
    lines += _items_lines("NFD_KEEP", [f"0x{c:X}" for c in nfd_codes])
    tail = tables.split("# fmt: on\n")[1]
    print("\n".join(lines) + "\n# fmt: on\n" + tail, end="")
