"""Character classes of HuggingFace's BERT normaliser/pre-tokenizer, as RE2 bracket bodies.

The reference (``tokenizers``' ``BertNormalizer`` + ``BertPreTokenizer``, used by
``BertTokenizerFast``) classifies characters with older Unicode tables than TensorFlow's RE2/ICU:
characters assigned or re-categorised since then (new marks, new punctuation, ``U+166D`` moved
from Po to So, ...) are treated differently, and its CJK ranges skip ``U+2B820..U+2B91F``. These
classes are therefore measured from the reference, one code point at a time, rather than taken
from ``\\p{...}``:

- ``DROP``: removed by clean-text (controls, format, private use, ``\\x00``, ``\\ufffd``).
- ``SPACE``: mapped to a space by clean-text.
- ``CJK``: surrounded by spaces.
- ``NONSPACING_MARK``: removed after NFD in uncased mode (accent stripping).
- ``PUNCT``: split off as one-character words by the pre-tokenizer.
- ``LOWERCASE``: ``(upper, lower)`` code points the reference lower-cases (newer Unicode case
  mappings) and ``tf.strings.lower`` leaves unchanged.
- ``NFD_KEEP``: code points TensorFlow's NFD decomposes (newer Unicode) and the reference keeps.

Generated from the reference by ``python tests/testdata/make_unicode_tables.py >
bertjax/data/unicode_tables.py`` (needs the ``test`` extra); ``tests/data/tokenization_test.py``
checks every code point against the reference.
"""

# fmt: off
DROP = (
    r"\x{0}-\x{8}\x{B}-\x{C}\x{E}-\x{1F}\x{7F}-\x{9F}\x{AD}\x{600}-\x{605}\x{61C}\x{6DD}"
    r"\x{70F}\x{180E}\x{200B}-\x{200F}\x{202A}-\x{202E}\x{2060}-\x{2064}\x{2066}-\x{206F}"
    r"\x{E000}-\x{F8FF}\x{FEFF}\x{FFF9}-\x{FFFB}\x{FFFD}\x{110BD}\x{1BCA0}-\x{1BCA3}"
    r"\x{1D173}-\x{1D17A}\x{E0001}\x{E0020}-\x{E007F}\x{F0000}-\x{FFFFD}\x{100000}-\x{10FFFD}"
)
SPACE = (
    r"\x{9}-\x{A}\x{D}\x{20}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}-\x{2029}\x{202F}\x{205F}"
    r"\x{3000}"
)
CJK = (
    r"\x{3400}-\x{4DBF}\x{4E00}-\x{9FFF}\x{F900}-\x{FAFF}\x{20000}-\x{2A6DF}"
    r"\x{2A700}-\x{2B81F}\x{2B920}-\x{2CEAF}\x{2F800}-\x{2FA1F}"
)
NONSPACING_MARK = (
    r"\x{300}-\x{36F}\x{483}-\x{487}\x{591}-\x{5BD}\x{5BF}\x{5C1}-\x{5C2}\x{5C4}-\x{5C5}"
    r"\x{5C7}\x{610}-\x{61A}\x{64B}-\x{65F}\x{670}\x{6D6}-\x{6DC}\x{6DF}-\x{6E4}"
    r"\x{6E7}-\x{6E8}\x{6EA}-\x{6ED}\x{711}\x{730}-\x{74A}\x{7A6}-\x{7B0}\x{7EB}-\x{7F3}"
    r"\x{816}-\x{819}\x{81B}-\x{823}\x{825}-\x{827}\x{829}-\x{82D}\x{859}-\x{85B}"
    r"\x{8E3}-\x{902}\x{93A}\x{93C}\x{941}-\x{948}\x{94D}\x{951}-\x{957}\x{962}-\x{963}\x{981}"
    r"\x{9BC}\x{9C1}-\x{9C4}\x{9CD}\x{9E2}-\x{9E3}\x{A01}-\x{A02}\x{A3C}\x{A41}-\x{A42}"
    r"\x{A47}-\x{A48}\x{A4B}-\x{A4D}\x{A51}\x{A70}-\x{A71}\x{A75}\x{A81}-\x{A82}\x{ABC}"
    r"\x{AC1}-\x{AC5}\x{AC7}-\x{AC8}\x{ACD}\x{AE2}-\x{AE3}\x{B01}\x{B3C}\x{B3F}\x{B41}-\x{B44}"
    r"\x{B4D}\x{B56}\x{B62}-\x{B63}\x{B82}\x{BC0}\x{BCD}\x{C00}\x{C3E}-\x{C40}\x{C46}-\x{C48}"
    r"\x{C4A}-\x{C4D}\x{C55}-\x{C56}\x{C62}-\x{C63}\x{C81}\x{CBC}\x{CBF}\x{CC6}\x{CCC}-\x{CCD}"
    r"\x{CE2}-\x{CE3}\x{D01}\x{D41}-\x{D44}\x{D4D}\x{D62}-\x{D63}\x{DCA}\x{DD2}-\x{DD4}\x{DD6}"
    r"\x{E31}\x{E34}-\x{E3A}\x{E47}-\x{E4E}\x{EB1}\x{EB4}-\x{EB9}\x{EBB}-\x{EBC}"
    r"\x{EC8}-\x{ECD}\x{F18}-\x{F19}\x{F35}\x{F37}\x{F39}\x{F71}-\x{F7E}\x{F80}-\x{F84}"
    r"\x{F86}-\x{F87}\x{F8D}-\x{F97}\x{F99}-\x{FBC}\x{FC6}\x{102D}-\x{1030}\x{1032}-\x{1037}"
    r"\x{1039}-\x{103A}\x{103D}-\x{103E}\x{1058}-\x{1059}\x{105E}-\x{1060}\x{1071}-\x{1074}"
    r"\x{1082}\x{1085}-\x{1086}\x{108D}\x{109D}\x{135D}-\x{135F}\x{1712}-\x{1714}"
    r"\x{1732}-\x{1734}\x{1752}-\x{1753}\x{1772}-\x{1773}\x{17B4}-\x{17B5}\x{17B7}-\x{17BD}"
    r"\x{17C6}\x{17C9}-\x{17D3}\x{17DD}\x{180B}-\x{180D}\x{18A9}\x{1920}-\x{1922}"
    r"\x{1927}-\x{1928}\x{1932}\x{1939}-\x{193B}\x{1A17}-\x{1A18}\x{1A1B}\x{1A56}"
    r"\x{1A58}-\x{1A5E}\x{1A60}\x{1A62}\x{1A65}-\x{1A6C}\x{1A73}-\x{1A7C}\x{1A7F}"
    r"\x{1AB0}-\x{1ABD}\x{1B00}-\x{1B03}\x{1B34}\x{1B36}-\x{1B3A}\x{1B3C}\x{1B42}"
    r"\x{1B6B}-\x{1B73}\x{1B80}-\x{1B81}\x{1BA2}-\x{1BA5}\x{1BA8}-\x{1BA9}\x{1BAB}-\x{1BAD}"
    r"\x{1BE6}\x{1BE8}-\x{1BE9}\x{1BED}\x{1BEF}-\x{1BF1}\x{1C2C}-\x{1C33}\x{1C36}-\x{1C37}"
    r"\x{1CD0}-\x{1CD2}\x{1CD4}-\x{1CE0}\x{1CE2}-\x{1CE8}\x{1CED}\x{1CF4}\x{1CF8}-\x{1CF9}"
    r"\x{1DC0}-\x{1DF5}\x{1DFC}-\x{1DFF}\x{20D0}-\x{20DC}\x{20E1}\x{20E5}-\x{20F0}"
    r"\x{2CEF}-\x{2CF1}\x{2D7F}\x{2DE0}-\x{2DFF}\x{302A}-\x{302D}\x{3099}-\x{309A}\x{A66F}"
    r"\x{A674}-\x{A67D}\x{A69E}-\x{A69F}\x{A6F0}-\x{A6F1}\x{A802}\x{A806}\x{A80B}"
    r"\x{A825}-\x{A826}\x{A8C4}\x{A8E0}-\x{A8F1}\x{A926}-\x{A92D}\x{A947}-\x{A951}"
    r"\x{A980}-\x{A982}\x{A9B3}\x{A9B6}-\x{A9B9}\x{A9BC}\x{A9E5}\x{AA29}-\x{AA2E}"
    r"\x{AA31}-\x{AA32}\x{AA35}-\x{AA36}\x{AA43}\x{AA4C}\x{AA7C}\x{AAB0}\x{AAB2}-\x{AAB4}"
    r"\x{AAB7}-\x{AAB8}\x{AABE}-\x{AABF}\x{AAC1}\x{AAEC}-\x{AAED}\x{AAF6}\x{ABE5}\x{ABE8}"
    r"\x{ABED}\x{FB1E}\x{FE00}-\x{FE0F}\x{FE20}-\x{FE2F}\x{101FD}\x{102E0}\x{10376}-\x{1037A}"
    r"\x{10A01}-\x{10A03}\x{10A05}-\x{10A06}\x{10A0C}-\x{10A0F}\x{10A38}-\x{10A3A}\x{10A3F}"
    r"\x{10AE5}-\x{10AE6}\x{11001}\x{11038}-\x{11046}\x{1107F}-\x{11081}\x{110B3}-\x{110B6}"
    r"\x{110B9}-\x{110BA}\x{11100}-\x{11102}\x{11127}-\x{1112B}\x{1112D}-\x{11134}\x{11173}"
    r"\x{11180}-\x{11181}\x{111B6}-\x{111BE}\x{111CA}-\x{111CC}\x{1122F}-\x{11231}\x{11234}"
    r"\x{11236}-\x{11237}\x{112DF}\x{112E3}-\x{112EA}\x{11300}-\x{11301}\x{1133C}\x{11340}"
    r"\x{11366}-\x{1136C}\x{11370}-\x{11374}\x{114B3}-\x{114B8}\x{114BA}\x{114BF}-\x{114C0}"
    r"\x{114C2}-\x{114C3}\x{115B2}-\x{115B5}\x{115BC}-\x{115BD}\x{115BF}-\x{115C0}"
    r"\x{115DC}-\x{115DD}\x{11633}-\x{1163A}\x{1163D}\x{1163F}-\x{11640}\x{116AB}\x{116AD}"
    r"\x{116B0}-\x{116B5}\x{116B7}\x{1171D}-\x{1171F}\x{11722}-\x{11725}\x{11727}-\x{1172B}"
    r"\x{16AF0}-\x{16AF4}\x{16B30}-\x{16B36}\x{16F8F}-\x{16F92}\x{1BC9D}-\x{1BC9E}"
    r"\x{1D167}-\x{1D169}\x{1D17B}-\x{1D182}\x{1D185}-\x{1D18B}\x{1D1AA}-\x{1D1AD}"
    r"\x{1D242}-\x{1D244}\x{1DA00}-\x{1DA36}\x{1DA3B}-\x{1DA6C}\x{1DA75}\x{1DA84}"
    r"\x{1DA9B}-\x{1DA9F}\x{1DAA1}-\x{1DAAF}\x{1E8D0}-\x{1E8D6}\x{E0100}-\x{E01EF}"
)
PUNCT = (
    r"\x{21}-\x{2F}\x{3A}-\x{40}\x{5B}-\x{60}\x{7B}-\x{7E}\x{A1}\x{A7}\x{AB}\x{B6}-\x{B7}"
    r"\x{BB}\x{BF}\x{37E}\x{387}\x{55A}-\x{55F}\x{589}-\x{58A}\x{5BE}\x{5C0}\x{5C3}\x{5C6}"
    r"\x{5F3}-\x{5F4}\x{609}-\x{60A}\x{60C}-\x{60D}\x{61B}\x{61E}-\x{61F}\x{66A}-\x{66D}"
    r"\x{6D4}\x{700}-\x{70D}\x{7F7}-\x{7F9}\x{830}-\x{83E}\x{85E}\x{964}-\x{965}\x{970}\x{AF0}"
    r"\x{DF4}\x{E4F}\x{E5A}-\x{E5B}\x{F04}-\x{F12}\x{F14}\x{F3A}-\x{F3D}\x{F85}\x{FD0}-\x{FD4}"
    r"\x{FD9}-\x{FDA}\x{104A}-\x{104F}\x{10FB}\x{1360}-\x{1368}\x{1400}\x{166D}-\x{166E}"
    r"\x{169B}-\x{169C}\x{16EB}-\x{16ED}\x{1735}-\x{1736}\x{17D4}-\x{17D6}\x{17D8}-\x{17DA}"
    r"\x{1800}-\x{180A}\x{1944}-\x{1945}\x{1A1E}-\x{1A1F}\x{1AA0}-\x{1AA6}\x{1AA8}-\x{1AAD}"
    r"\x{1B5A}-\x{1B60}\x{1BFC}-\x{1BFF}\x{1C3B}-\x{1C3F}\x{1C7E}-\x{1C7F}\x{1CC0}-\x{1CC7}"
    r"\x{1CD3}\x{2010}-\x{2027}\x{2030}-\x{2043}\x{2045}-\x{2051}\x{2053}-\x{205E}"
    r"\x{207D}-\x{207E}\x{208D}-\x{208E}\x{2308}-\x{230B}\x{2329}-\x{232A}\x{2768}-\x{2775}"
    r"\x{27C5}-\x{27C6}\x{27E6}-\x{27EF}\x{2983}-\x{2998}\x{29D8}-\x{29DB}\x{29FC}-\x{29FD}"
    r"\x{2CF9}-\x{2CFC}\x{2CFE}-\x{2CFF}\x{2D70}\x{2E00}-\x{2E2E}\x{2E30}-\x{2E42}"
    r"\x{3001}-\x{3003}\x{3008}-\x{3011}\x{3014}-\x{301F}\x{3030}\x{303D}\x{30A0}\x{30FB}"
    r"\x{A4FE}-\x{A4FF}\x{A60D}-\x{A60F}\x{A673}\x{A67E}\x{A6F2}-\x{A6F7}\x{A874}-\x{A877}"
    r"\x{A8CE}-\x{A8CF}\x{A8F8}-\x{A8FA}\x{A8FC}\x{A92E}-\x{A92F}\x{A95F}\x{A9C1}-\x{A9CD}"
    r"\x{A9DE}-\x{A9DF}\x{AA5C}-\x{AA5F}\x{AADE}-\x{AADF}\x{AAF0}-\x{AAF1}\x{ABEB}"
    r"\x{FD3E}-\x{FD3F}\x{FE10}-\x{FE19}\x{FE30}-\x{FE52}\x{FE54}-\x{FE61}\x{FE63}\x{FE68}"
    r"\x{FE6A}-\x{FE6B}\x{FF01}-\x{FF03}\x{FF05}-\x{FF0A}\x{FF0C}-\x{FF0F}\x{FF1A}-\x{FF1B}"
    r"\x{FF1F}-\x{FF20}\x{FF3B}-\x{FF3D}\x{FF3F}\x{FF5B}\x{FF5D}\x{FF5F}-\x{FF65}"
    r"\x{10100}-\x{10102}\x{1039F}\x{103D0}\x{1056F}\x{10857}\x{1091F}\x{1093F}"
    r"\x{10A50}-\x{10A58}\x{10A7F}\x{10AF0}-\x{10AF6}\x{10B39}-\x{10B3F}\x{10B99}-\x{10B9C}"
    r"\x{11047}-\x{1104D}\x{110BB}-\x{110BC}\x{110BE}-\x{110C1}\x{11140}-\x{11143}"
    r"\x{11174}-\x{11175}\x{111C5}-\x{111C9}\x{111CD}\x{111DB}\x{111DD}-\x{111DF}"
    r"\x{11238}-\x{1123D}\x{112A9}\x{114C6}\x{115C1}-\x{115D7}\x{11641}-\x{11643}"
    r"\x{1173C}-\x{1173E}\x{12470}-\x{12474}\x{16A6E}-\x{16A6F}\x{16AF5}\x{16B37}-\x{16B3B}"
    r"\x{16B44}\x{1BC9F}\x{1DA87}-\x{1DA8B}"
)
LOWERCASE = (
    (0x1C89, 0x1C8A), (0x2C2F, 0x2C5F), (0xA7C0, 0xA7C1), (0xA7CB, 0x264), (0xA7CC, 0xA7CD),
    (0xA7CE, 0xA7CF), (0xA7D0, 0xA7D1), (0xA7D2, 0xA7D3), (0xA7D4, 0xA7D5), (0xA7D6, 0xA7D7),
    (0xA7D8, 0xA7D9), (0xA7DA, 0xA7DB), (0xA7DC, 0x19B), (0x10570, 0x10597), (0x10571, 0x10598),
    (0x10572, 0x10599), (0x10573, 0x1059A), (0x10574, 0x1059B), (0x10575, 0x1059C),
    (0x10576, 0x1059D), (0x10577, 0x1059E), (0x10578, 0x1059F), (0x10579, 0x105A0),
    (0x1057A, 0x105A1), (0x1057C, 0x105A3), (0x1057D, 0x105A4), (0x1057E, 0x105A5),
    (0x1057F, 0x105A6), (0x10580, 0x105A7), (0x10581, 0x105A8), (0x10582, 0x105A9),
    (0x10583, 0x105AA), (0x10584, 0x105AB), (0x10585, 0x105AC), (0x10586, 0x105AD),
    (0x10587, 0x105AE), (0x10588, 0x105AF), (0x10589, 0x105B0), (0x1058A, 0x105B1),
    (0x1058C, 0x105B3), (0x1058D, 0x105B4), (0x1058E, 0x105B5), (0x1058F, 0x105B6),
    (0x10590, 0x105B7), (0x10591, 0x105B8), (0x10592, 0x105B9), (0x10594, 0x105BB),
    (0x10595, 0x105BC), (0x10D50, 0x10D70), (0x10D51, 0x10D71), (0x10D52, 0x10D72),
    (0x10D53, 0x10D73), (0x10D54, 0x10D74), (0x10D55, 0x10D75), (0x10D56, 0x10D76),
    (0x10D57, 0x10D77), (0x10D58, 0x10D78), (0x10D59, 0x10D79), (0x10D5A, 0x10D7A),
    (0x10D5B, 0x10D7B), (0x10D5C, 0x10D7C), (0x10D5D, 0x10D7D), (0x10D5E, 0x10D7E),
    (0x10D5F, 0x10D7F), (0x10D60, 0x10D80), (0x10D61, 0x10D81), (0x10D62, 0x10D82),
    (0x10D63, 0x10D83), (0x10D64, 0x10D84), (0x10D65, 0x10D85), (0x16EA0, 0x16EBB),
    (0x16EA1, 0x16EBC), (0x16EA2, 0x16EBD), (0x16EA3, 0x16EBE), (0x16EA4, 0x16EBF),
    (0x16EA5, 0x16EC0), (0x16EA6, 0x16EC1), (0x16EA7, 0x16EC2), (0x16EA8, 0x16EC3),
    (0x16EA9, 0x16EC4), (0x16EAA, 0x16EC5), (0x16EAB, 0x16EC6), (0x16EAC, 0x16EC7),
    (0x16EAD, 0x16EC8), (0x16EAE, 0x16EC9), (0x16EAF, 0x16ECA), (0x16EB0, 0x16ECB),
    (0x16EB1, 0x16ECC), (0x16EB2, 0x16ECD), (0x16EB3, 0x16ECE), (0x16EB4, 0x16ECF),
    (0x16EB5, 0x16ED0), (0x16EB6, 0x16ED1), (0x16EB7, 0x16ED2), (0x16EB8, 0x16ED3),
)
NFD_KEEP = (
    0x105C9, 0x105E4, 0x11383, 0x11385, 0x1138E, 0x11391, 0x113C5, 0x113C7, 0x113C8, 0x11938,
    0x16121, 0x16122, 0x16123, 0x16124, 0x16125, 0x16126, 0x16127, 0x16128, 0x16D68, 0x16D69,
    0x16D6A,
)
# fmt: on
