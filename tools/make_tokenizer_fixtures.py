#!/usr/bin/env python3
"""Generates the tokenizer/chat-template reference fixtures under tests/fixtures/tokenizer/.

Reference implementation: Hugging Face `tokenizers` (and `transformers` + jinja2 for the chat
template). Needed only to regenerate the fixtures, never at run time or in tests.

Outputs:
  gemma3_cases.json   encode/decode cases for the real 262k Gemma tokenizer (--gemma: a tokenizer.json,
                      or a .tar.xz holding one; default tests/fixtures/tokenizer/gemma3/tokenizer.json.tar.xz)
  tiny/               a 512-token BPE tokenizer with Gemma's structure, plus tokenizer_config.json,
                      generation_config.json and chat_template.jinja
  tiny_cases.json     encode/decode cases for the tiny tokenizer
  chat_cases.json     conversations rendered by chat_template.jinja (via transformers), with tiny ids

Usage: python3 tools/make_tokenizer_fixtures.py [--gemma PATH] [--out DIR]
"""
import argparse
import json
import os
import random
import sys
import tarfile
import tempfile

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_GEMMA = os.path.join(REPO, "tests", "fixtures", "tokenizer", "gemma3", "tokenizer.json.tar.xz")
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "tokenizer")

# ---------------------------------------------------------------------------------------------
# Test strings
# ---------------------------------------------------------------------------------------------

HANDWRITTEN = [
    # empty and single characters
    "", "a", "Z", " ", "\n", "\t", "\r", "é", "中", "😀", "\x00", "\x7f", "~", "ß", "ñ", "ا", "ה", "ก", "я",
    # basic English
    "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "I can't believe it's not butter!", "e.g. i.e. etc. vs. Mr. Mrs. Dr.",
    "ALL CAPS SENTENCE WITH SHOUTING", "mIxEd CaSe WoRdS", "hyphen-ated and under_scored words",
    "Quotes: \"double\", 'single', «guillemets», „German“, “curly”",
    # whitespace
    "  ", "   ", "    leading spaces", "trailing spaces    ", "a  b   c    d     e",
    "\t\tindented with tabs", "line1\nline2\nline3", "para1\n\npara2\n\n\npara3", "\r\n", "win\r\nlines\r\n",
    " \t \n \r\n \t\t  ", "\n" * 40, " " * 40, "\t" * 40, " \n" * 20, "tab\tseparated\tvalues\t1\t2",
    "\u00a0nbsp\u00a0", "\u2003em space\u2003", "\u3000ideographic\u3000space", "\u2028line sep\u2029para sep",
    "\v\f", "x" + " " * 100 + "y", "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
    # special-token strings typed as text (whatever exists in the vocab is matched as one token)
    "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "[multimodal]",
    "<|turn>", "<turn|>", "<|turn>user\nHi<turn|>\n<|turn>model\n", "<start_of_image>", "<end_of_image>",
    "<image_soft_token>", "<unused0>", "<unused99>", "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos><bos>", "<<bos>>", "<start_of_tur", "start_of_turn>", "<0x41>", "<0xZZ>", "<table><tr><td>x</td></tr></table>",
    "text<eos>more", "<h1>Title</h1>", "▁", "▁▁", "▁▁▁x", "▁hello▁world", "<|channel>thought\n<channel|>",
    "<|think|>", "<|tool_call>call:f{}<tool_call|>", "<start_of_turn> spaced <end_of_turn>",
    # numbers
    "0", "42", "-42", "3.14159265358979", "1,000,000", "1e-10", "6.022e23", "0xDEADBEEF", "0b101010",
    "12345678901234567890", "2024-01-31T12:34:56Z", "+1 (555) 123-4567", "$1,234.56", "€99,99", "50%",
    "١٢٣٤٥", "१२३४५", "一二三四五", "Ⅻ ⅻ", "½ ⅓ ¾",
    # URLs, emails, paths
    "https://www.example.com/path/to/page?query=1&other=two#anchor", "http://localhost:8080/",
    "ftp://files.example.org/pub/file.tar.gz", "user.name+tag@example.co.uk", "C:\\Program Files\\App\\app.exe",
    "/usr/local/lib/python3.11/site-packages/", "~/.config/nvim/init.lua", "git@github.com:owner/repo.git",
    # many scripts
    "你好，世界！今天天气很好。", "我爱自然语言处理。", "日本語のテキストです。ひらがなとカタカナ。",
    "東京は日本の首都です。", "안녕하세요, 세계! 한국어 텍스트입니다.", "مرحبا بالعالم! هذا نص عربي.",
    "שלום עולם! זהו טקסט בעברית.", "नमस्ते दुनिया! यह हिंदी पाठ है।", "สวัสดีชาวโลก นี่คือข้อความภาษาไทย",
    "Привет, мир! Это русский текст.", "Γειά σου Κόσμε! Αυτό είναι ελληνικό κείμενο.",
    "Xin chào thế giới! Đây là văn bản tiếng Việt.", "Merhaba dünya! Bu Türkçe bir metindir.",
    "হ্যালো বিশ্ব! এটি বাংলা পাঠ।", "வணக்கம் உலகம்!", "გამარჯობა მსოფლიო!", "Բարեւ աշխարհ!",
    "ሰላም ልዑል!", "سلام دنیا! این یک متن فارسی است.", "ہیلو دنیا! یہ اردو متن ہے۔", "ສະບາຍດີ", "ជំរាបសួរ",
    "မင်္ဂလာပါ", "Здравей, свят!", "Γκρῖζος ἵππος", "Ꭰ Ꭱ Ꭲ Cherokee", "ᚠᚢᚦᚨᚱᚲ runes", "ⴰⵣⵓⵍ Tifinagh",
    "Ελληνικά and English mixed with 中文 and العربية", "עברית עם English באמצע",
    "Łódź, Kraków, Gdańsk", "Příliš žluťoučký kůň úpěl ďábelské ódy", "Árvíztűrő tükörfúrógép",
    "Ærøskøbing og Ålborg", "ĀāĒēĪīŌōŪū", "ǅ ǈ ǋ ǲ",
    # emoji
    "👍", "👍🏽", "👨‍👩‍👧‍👦", "👩🏿‍💻", "🏳️‍🌈", "🇺🇸🇯🇵🇩🇪", "1️⃣ #️⃣", "❤️", "🧑‍🤝‍🧑", "😀😃😄😁😆😅😂🤣",
    "I love 🍕 and 🍺!", "🫠🫡🫥🪿", "☺ ☻ ♥ ♦", "🏴󠁧󠁢󠁳󠁣󠁴󠁿",
    # rare Unicode
    "e\u0301", "Z\u0324\u0316\u034e\u0347a\u0325\u032a\u0359l\u0326g\u0329o\u0330", "\u200f", "\u200e",
    "abc\u200fdef\u200e", "\u200d", "\u200c", "\ufeffBOM", "\ue000\ue001\uf8ff", "\U000f0000\U0010fffd",
    "\U0010ffff", "\U0001d518\U0001d52b\U0001d526", "\U0001d11e", "\U00012000\U00012001", "\U00013000",
    "\U00010000", "\ufffd", "\ufffe", "\u0085", "\u061c", "\u2066isolate\u2069", "Å Å", "ﬁ ﬂ ﬀ",
    "\u1f00\u0345", "ｆｕｌｌｗｉｄｔｈ", "ｶﾀｶﾅ", "\u0e01\u0e34\u0e4a", "\u0915\u094d\u0937",
    # code
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"hello\\n\");\n\treturn 0;\n}\n",
    "template <typename T>\nstd::vector<T> v{1, 2, 3};\nauto x = v[0] << 2 >> 1;\n",
    "const f = async (x) => { await fetch(`/api/${x}`); return x ?? null; };",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "<!DOCTYPE html>\n<html lang=\"en\"><head><title>T</title></head><body><p>x</p></body></html>",
    "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done 2>&1 | tee log",
    "\\begin{equation} E = mc^2 \\quad \\int_0^\\infty e^{-x^2} dx = \\frac{\\sqrt{\\pi}}{2} \\end{equation}",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares\n",
    "if (a != b && c <= d || !e) { x += 1; y -= 2; z *= 3; w /= 4; }",
    "public static void main(String[] args) { System.out.println(\"Hello\"); }",
    "  - name: build\n    run: |\n      cmake -S . -B build\n      cmake --build build\n",
    "| col1 | col2 |\n|------|------|\n| a    | b    |\n", "**bold** _italic_ `code` ~~strike~~ [link](http://x.y)",
    "=====", "-----", "....", "!!!???", "((()))", "[[[]]]", "{{{}}}", "<<<>>>", "@#$%^&*", "\\\\\\\\",
    # mixed documents
    "Dear Sir/Madam,\n\nI am writing to inquire about the position.\n\nBest regards,\nJohn",
    "Q: What is 2+2?\nA: 4.\n\nQ: What is the capital of France?\nA: Paris.",
    "Step 1: Open the box.\nStep 2: Remove the device.\nStep 3: Plug it in. ✅",
]


def random_strings(rng):
    """Seeded random strings drawn from a pool of many scripts, symbols and whitespace."""
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
        " \t\n  ", ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
        "你好世界中文字符测试数据模型", "あいうえおカキクケコ日本", "한국어텍스트입니다", "абвгдеёжзийклмнопрстуфхцчшщъыьэюя",
        "αβγδεζηθικλμνξοπρστυφχψω", "אבגדהוזחטיכלמנסעפצקרשת", "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
        "अआइईउऊऋएऐओऔकखगघ", "กขฃคฅฆงจฉชซฌญฎฏ", "😀😎🚀🌍🎉👍🏽❤️🔥", "\u0301\u0308\u200d\u200c\u200f",
        "\ue000\U000f0000\U0010fffd\U0001d518\U00012000",
    ]
    out = []
    for _ in range(70):
        n = rng.randint(1, 80)
        weights = [rng.random() for _ in pools]
        s = "".join(rng.choice(rng.choices(pools, weights)[0]) for _ in range(n))
        out.append(s)
    return out


def long_strings(rng):
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [
        "a" * 5000,
        "ab" * 2500,
        "".join(rng.choice(letters) for _ in range(5000)),
        "中" * 3000,
        "😀" * 1000,
        "9" * 5000,
        " " * 5000,
        "\n" * 500,
        "supercalifragilisticexpialidocious" * 150,
        " ".join(rng.choice(["the", "of", "and", "to", "in", "is", "model", "token", "gemma"]) for _ in range(1500)),
        "".join(rng.choice("0123456789abcdef") for _ in range(4096)),
        "<start_of_turn>" * 200,
    ]


INVALID_UTF8 = [
    b"\xff", b"\xfe\xff", b"\x80", b"abc\x80def", b"\xc0\xaf", b"\xc2", b"\xe4\xb8", b"\xe4\xb8\xe4\xb8\xad",
    b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf0\x9f\x98", b"\xf0\x9f\x98x", b"\xf0\x80\x80\x80", b"\xf4\x90\x80\x80",
    b"\xf8\x88\x80\x80\x80", b"\xfc\x84\x80\x80\x80\x80", b"\xe0\x80\xaf", b"\xe0\xa0", b"hello \xe2\x82 world",
    b"<start_of_turn>\xff<end_of_turn>", b"\xc3\x28", b"\xa0\xa1", b"\xe2\x28\xa1", b"\xe2\x82\x28",
    b"\xf0\x28\x8c\xbc", b"\xf0\x90\x28\xbc", b"\xf0\x28\x8c\x28", b"\x00\xff\x00", b"caf\xe9", b"\xef\xbf\xbd\xff",
]


def random_invalid(rng):
    out = []
    for _ in range(30):
        n = rng.randint(1, 40)
        b = bytearray()
        for _ in range(n):
            r = rng.random()
            if r < 0.4:
                b.append(rng.randint(0x20, 0x7E))
            elif r < 0.7:
                b.append(rng.randint(0x80, 0xFF))
            else:
                b += rng.choice(["é", "中", "😀", " ", "\n"]).encode()
        out.append(bytes(b))
    return out


# ---------------------------------------------------------------------------------------------
# Case generation
# ---------------------------------------------------------------------------------------------


def text_cases(tok, texts, n_with_special):
    cases = []
    for i, t in enumerate(texts):
        ids = tok.encode(t, add_special_tokens=False).ids
        c = {"text": t, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)}
        skip = tok.decode(ids, skip_special_tokens=True)
        if skip != c["decoded"]:
            c["decoded_skip_special"] = skip
        if i < n_with_special:
            c["ids_with_special"] = tok.encode(t, add_special_tokens=True).ids
        cases.append(c)
    return cases


def invalid_cases(tok, blobs):
    cases = []
    for b in blobs:
        t = b.decode("utf-8", errors="replace")
        cases.append({"hex": b.hex(), "replaced": t, "ids": tok.encode(t, add_special_tokens=False).ids})
    return cases


def decode_cases(tok, id_lists):
    return [
        {
            "ids": ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        }
        for ids in id_lists
    ]


def byte_ids(tok):
    return [tok.token_to_id("<0x%02X>" % b) for b in range(256)]


def decode_id_lists(tok, rng):
    by = byte_ids(tok)
    sp = [tok.token_to_id(s) for s in ("<bos>", "<eos>", "<pad>")]
    words = tok.encode("Hello world", add_special_tokens=False).ids
    lists = [
        [by[0xE4]], [by[0xE4], by[0xB8], by[0xAD]], [by[0xE4], by[0xB8]], [by[0xE4], by[0xB8], by[0xAD], by[0xFF]],
        [by[0x41]], [by[0x00]], [by[0x80]], [by[0xF0], by[0x9F], by[0x98], by[0x80]], [by[0xF0], by[0x9F], by[0x98]],
        words + [by[0xC3]] + words, [by[0xC3]] + words + [by[0xA9]], [by[0xC3], by[0xA9]] + words,
        sp + words + sp, [sp[0]] + [by[0xE4]] + [sp[1]] + [by[0xB8], by[0xAD]], [], [by[0xED], by[0xA0], by[0x80]],
    ]
    for _ in range(20):
        lists.append([rng.choice(by) if rng.random() < 0.7 else rng.choice(words + sp) for _ in range(rng.randint(1, 12))])
    return lists


# ---------------------------------------------------------------------------------------------
# Tiny tokenizer
# ---------------------------------------------------------------------------------------------

TINY_VOCAB = 512

# Gemma 4 ids for the control tokens that exist in the real vocabulary; the rest of 0..107 is padded
# with <unusedN> like Gemma does.
TINY_FIXED = {
    0: ("<pad>", True), 1: ("<eos>", True), 2: ("<bos>", True), 3: ("<unk>", True), 4: ("<mask>", False),
    5: ("[multimodal]", False), 46: ("<|tool>", True), 47: ("<tool|>", True), 48: ("<|tool_call>", True),
    49: ("<tool_call|>", True), 50: ("<|tool_response>", True), 51: ("<tool_response|>", True),
    52: ('<|"|>', True), 98: ("<|think|>", True), 100: ("<|channel>", True), 101: ("<channel|>", True),
    105: ("<|turn>", True), 106: ("<turn|>", True), 107: ("\n", False),
}
TINY_NUM_CONTROL = 108  # ids 0..107; byte tokens follow at 108..363

CORPUS_PARAGRAPHS = [
    "The model reads a prompt, turns it into tokens, and predicts the next token one step at a time.",
    "A tokenizer splits text into pieces that are common in the training data, so frequent words become "
    "single tokens while rare words are spelled out from smaller parts.",
    "When the weather is good we walk to the river, sit on the bench under the old tree and talk about "
    "books, music, and the things we want to build next year.",
    "Please write a short answer. Keep it simple and clear, and explain each step of the reasoning.",
    "The user asked a question about the system, and the assistant gave a helpful and honest answer.",
    "In the morning the city is quiet; by noon the streets are full of people, cars, and noise.",
    "Hello! How are you today? I am fine, thank you. What would you like to talk about?",
    "Numbers such as 1, 2, 3, 10, 42, 100 and 2024 appear in many sentences about time and money.",
]

SUBJECTS = ["the model", "a student", "my friend", "the teacher", "our team", "the computer", "this program",
            "the small cat", "a young writer", "the old man", "every user", "the assistant"]
VERBS = ["reads", "writes", "likes", "makes", "finds", "takes", "gives", "sees", "needs", "wants", "builds",
         "answers", "learns", "helps", "explains", "checks"]
OBJECTS = ["the book", "a letter", "the answer", "some water", "the code", "a new idea", "the question",
           "the story", "a good plan", "the test", "many words", "the next token", "the result"]
TAILS = ["today.", "every day.", "in the morning.", "at home.", "with care.", "very quickly.", "again and again.",
         "for the first time.", "before dinner.", "after the meeting.", "without any help.", "."]


def tiny_corpus(rng):
    lines = list(CORPUS_PARAGRAPHS) * 20
    for _ in range(4000):
        s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}"
        lines.append(s[0].upper() + s[1:])
    return lines


GEMMA_NORMALIZER = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
GEMMA_PRE_TOKENIZER = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
GEMMA_DECODER = {
    "type": "Sequence",
    "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ],
}
GEMMA_POST_PROCESSOR = {
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [
        {"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
        {"SpecialToken": {"id": "<bos>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}},
    ],
    "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}},
}


def build_tiny(rng):
    control = []
    unused = 0
    for i in range(TINY_NUM_CONTROL):
        if i in TINY_FIXED:
            control.append(TINY_FIXED[i])
        else:
            control.append((f"<unused{unused}>", False))
            unused += 1
    reserved = [c for c, _ in control] + ["<0x%02X>" % b for b in range(256)]

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    # Training only: split before each "▁" so merges stay inside words, as SentencePiece does.
    tok.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=reserved, limit_alphabet=56,
                                  show_progress=False)
    tok.train_from_iterator(tiny_corpus(rng), trainer)

    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    assert len(vocab) == TINY_VOCAB, len(vocab)
    for i, name in enumerate(reserved):
        assert vocab[name] == i, (name, vocab[name], i)
    j["added_tokens"] = [
        {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": sp}
        for i, (c, sp) in enumerate(control)
    ]
    j["normalizer"] = GEMMA_NORMALIZER
    j["pre_tokenizer"] = GEMMA_PRE_TOKENIZER
    j["decoder"] = GEMMA_DECODER
    j["post_processor"] = GEMMA_POST_PROCESSOR
    j["model"]["dropout"] = None
    j["model"]["fuse_unk"] = True
    j["model"]["byte_fallback"] = True
    j["model"]["unk_token"] = "<unk>"
    text = json.dumps(j, ensure_ascii=False, indent=2)
    tiny = Tokenizer.from_str(text)
    assert tiny.get_vocab_size(with_added_tokens=True) == TINY_VOCAB
    assert tiny.token_to_id("<|turn>") == 105 and tiny.token_to_id("<turn|>") == 106
    return text, tiny


TINY_TOKENIZER_CONFIG = {
    "tokenizer_class": "GemmaTokenizer",
    "add_bos_token": True,
    "add_eos_token": False,
    "bos_token": "<bos>",
    "eos_token": "<turn|>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
    "padding_side": "left",
    "clean_up_tokenization_spaces": False,
    "spaces_between_special_tokens": False,
    "model_max_length": 131072,
}

TINY_GENERATION_CONFIG = {
    "bos_token_id": 2,
    "pad_token_id": 0,
    "eos_token_id": [1, 106],
    "do_sample": True,
    "temperature": 1.0,
    "top_k": 64,
    "top_p": 0.95,
}

CHAT_TEMPLATE = r"""{#- Gemma 4 E2B/E4B chat template, text-only subset (no tools, no thinking flag, no media):
    optional system/developer preamble, user/model turns with thinking stripped from model history,
    and the model generation prompt. -#}
{%- macro strip_thinking(text) -%}
    {%- set ns = namespace(result='') -%}
    {%- for part in text.split('<channel|>') -%}
        {%- if '<|channel>' in part -%}
            {%- set ns.result = ns.result + part.split('<|channel>')[0] -%}
        {%- else -%}
            {%- set ns.result = ns.result + part -%}
        {%- endif -%}
    {%- endfor -%}
    {{- ns.result | trim -}}
{%- endmacro -%}
{%- macro render_text(role, text) -%}
    {%- if role == 'model' -%}
        {{- strip_thinking(text) -}}
    {%- else -%}
        {{- text | trim -}}
    {%- endif -%}
{%- endmacro -%}
{%- set loop_messages = messages -%}
{{- bos_token -}}
{%- if messages[0]['role'] in ['system', 'developer'] -%}
    {{- '<|turn>system\n' -}}
    {{- messages[0]['content'] | trim -}}
    {%- set loop_messages = messages[1:] -%}
    {{- '<turn|>\n' -}}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{- '<|turn>' + role + '\n' -}}
    {%- if message['content'] is string -%}
        {{- render_text(role, message['content']) -}}
    {%- elif message['content'] is sequence -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'text' -%}
                {{- render_text(role, item['text']) -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{- '<turn|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|turn>model\n' -}}
{%- endif -%}
"""

CHAT_CONVERSATIONS = [
    ("single_user", [{"role": "user", "content": "Hello"}], True),
    ("single_user_no_prompt", [{"role": "user", "content": "Hello"}], False),
    ("system_user", [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "What is 2+2?"}], True),
    ("developer_user", [{"role": "developer", "content": "Answer briefly."},
                        {"role": "user", "content": "Name a color."}], True),
    ("multi_turn", [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Tell me a joke."}], True),
    ("system_multi_turn", [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "One?"},
                           {"role": "assistant", "content": "Two."}, {"role": "user", "content": "Three?"},
                           {"role": "model", "content": "Four."}], False),
    ("trim_whitespace", [{"role": "system", "content": "  \n\tSystem with spaces\t \n"},
                         {"role": "user", "content": "\n\n  user text  \n"},
                         {"role": "assistant", "content": "  answer\n\n"}, {"role": "user", "content": " \t "}], True),
    ("unicode_whitespace_trim", [{"role": "user", "content": "\u3000\u00a0wide space\u2003\u2028"}], True),
    ("control_whitespace_trim", [{"role": "user", "content": "\x1c\x1f\x85 text \x0b\x0c\u200b"},
                                 {"role": "assistant", "content": "\u205f\u1680reply\u202f"}], True),
    ("inner_whitespace_kept", [{"role": "user", "content": "line 1\n\nline 2\t\ttabs   spaces"}], True),
    ("thinking_stripped", [{"role": "user", "content": "Solve it."},
                           {"role": "assistant", "content": "<|channel>thought\nLet me think.<channel|>The answer is 4."},
                           {"role": "user", "content": "Thanks"}], True),
    ("empty_content", [{"role": "user", "content": ""}], True),
    ("empty_system", [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}], True),
    ("system_not_first", [{"role": "user", "content": "a"}, {"role": "system", "content": " late system "},
                          {"role": "user", "content": "b"}], True),
    ("other_role", [{"role": "user", "content": "call it"}, {"role": "tool", "content": " result "}], True),
    ("unicode_content", [{"role": "user", "content": "你好 😀 مرحبا"}], True),
    ("special_tokens_in_content", [{"role": "user", "content": "<|turn>model\nfake<turn|>"}], True),
    ("assistant_last_no_prompt", [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}], False),
]

TINY_TEXTS = [
    "", "Hello world", "The model reads the book today.", "Please write a short answer.",
    "hello", "HELLO", "  two leading spaces", "tabs\tand\nnewlines\n\n", "<|turn>user\nHi<turn|>\n<|turn>model\n",
    "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<|think|>", "<|channel>thought\n<channel|>", "<unused0>",
    "<turn|><turn|>", "<|turn", "turn|>", "中文 and emoji 😀", "café naïve résumé", "1234567890", "Ünïcödé",
    "x" * 300, "the " * 100, "\n" * 10, " " * 33, "Numbers such as 1, 2, 3, 10, 42, 100 and 2024.",
    "\U0010fffd", "A tokenizer splits text into pieces.", "Zebra quiz jumps vex QW.",
]


def _added(i, content, **flags):
    tok = {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
           "normalized": False, "special": False}
    tok.update(flags)
    return tok


def _split(behavior):
    return {"type": "Split", "pattern": {"String": " "}, "behavior": behavior, "invert": False}


# Pipeline variants of the tiny tokenizer exercising options Gemma does not use. Each patch replaces
# top-level keys (or "model.<key>"); "extra_added" is appended to added_tokens.
TINY_VARIANTS = [
    ("added_token_flags", {}, [
        _added(512, "[L]", lstrip=True, special=True), _added(513, "[R]", rstrip=True),
        _added(514, "cat", single_word=True), _added(515, "a b", normalized=True),
        _added(516, "<|turn>", special=True),  # duplicate of an existing token: same id, flags replaced
    ], ["x  [L]", "[R]  x", "cat", "the cat sat", "concatenate", "cat,cat", "cat_", "xa by", "[L]hi",
        "a[L] [R] b", "  [L]  [R]  ", "[L][L][R][R]", "\t[L]\n", "<|turn>user"]),
    ("split_removed", {"normalizer": None, "pre_tokenizer": _split("Removed")}, [],
     ["he  he", " a b ", "the cat sat  down "]),
    ("split_isolated", {"normalizer": None, "pre_tokenizer": _split("Isolated")}, [],
     ["he  he", " a b ", "the cat sat  down "]),
    ("split_merged_prev", {"normalizer": None, "pre_tokenizer": _split("MergedWithPrevious")}, [],
     ["he  he", " a b ", "the cat sat  down "]),
    ("split_merged_next", {"normalizer": None, "pre_tokenizer": _split("MergedWithNext")}, [],
     ["he  he", " a b ", "the cat sat  down "]),
    ("split_contiguous", {"normalizer": None, "pre_tokenizer": _split("Contiguous")}, [],
     ["he  he", " a b ", "the cat sat  down "]),
    ("sequence_steps", {
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"String": "  "}, "content": " "}, GEMMA_NORMALIZER]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": "\u2581"}, "behavior": "MergedWithNext", "invert": False}]},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}, {"type": "Fuse"}]},
     }, [], ["the  model   reads", " a b ", "  x  "]),
    ("no_decoder_no_post", {"decoder": None, "post_processor": None}, [], ["the model", "中 x"]),
    ("unk_no_fuse_no_fallback", {"model.byte_fallback": False, "model.fuse_unk": False}, [],
     ["中文 x", "日本語", "a中b", "ßßß"]),
    ("unk_fused_no_fallback", {"model.byte_fallback": False}, [], ["中文 x", "日本語", "a中b", "ßßß"]),
    ("ignore_merges", {"model.ignore_merges": True}, [], ["the", "answer", "the answer", "quickly."]),
]


def tiny_variants(tiny_text):
    out = []
    for name, patch, extra, texts in TINY_VARIANTS:
        j = json.loads(tiny_text)
        for k, v in patch.items():
            if k.startswith("model."):
                j["model"][k[6:]] = v
            else:
                j[k] = v
        j["added_tokens"] += extra
        tok = Tokenizer.from_str(json.dumps(j))
        out.append({"name": name, "patch": patch, "extra_added": extra,
                    "cases": text_cases(tok, texts, len(texts))})
    return out


def load_gemma(path):
    """The Gemma tokenizer from a tokenizer.json or from a .tar.xz archive whose tokenizer.json it reads."""
    if not path.endswith(".tar.xz"):
        return Tokenizer.from_file(path)
    with tarfile.open(path, "r:xz") as tar:
        try:
            text = tar.extractfile("tokenizer.json").read().decode("utf-8")
        except KeyError:
            sys.exit(f"{path}: the archive holds no tokenizer.json")
    return Tokenizer.from_str(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gemma", default=DEFAULT_GEMMA,
                    help="the real Gemma tokenizer: tokenizer.json or a .tar.xz holding it (default: %(default)s)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    out = args.out
    os.makedirs(os.path.join(out, "tiny"), exist_ok=True)

    def dump(path, obj):
        with open(os.path.join(out, path), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
            f.write("\n")

    # Real Gemma tokenizer.
    rng = random.Random(1234)
    gemma = load_gemma(args.gemma)
    texts = HANDWRITTEN + random_strings(rng) + long_strings(rng)
    assert len(set(texts)) == len(texts), "duplicate test strings"
    dump("gemma3_cases.json", {
        "generator": "tools/make_tokenizer_fixtures.py",
        "reference": "tokenizers " + __import__("tokenizers").__version__,
        "vocab_size_with_added": gemma.get_vocab_size(with_added_tokens=True),
        "cases": text_cases(gemma, texts, 40),
        "invalid_utf8": invalid_cases(gemma, INVALID_UTF8 + random_invalid(rng)),
        "decode": decode_cases(gemma, decode_id_lists(gemma, rng)),
    })
    print(f"gemma3_cases.json: {len(texts)} texts")

    # Tiny tokenizer with Gemma's structure.
    tiny_text, tiny = build_tiny(random.Random(7))
    with open(os.path.join(out, "tiny", "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tiny_text + "\n")
    dump("tiny/tokenizer_config.json", TINY_TOKENIZER_CONFIG)
    dump("tiny/generation_config.json", TINY_GENERATION_CONFIG)
    with open(os.path.join(out, "tiny", "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(CHAT_TEMPLATE)
    rng = random.Random(99)
    tiny_texts = TINY_TEXTS + [t for t in HANDWRITTEN[::3] if t not in TINY_TEXTS]
    dump("tiny_cases.json", {
        "generator": "tools/make_tokenizer_fixtures.py",
        "vocab_size_with_added": tiny.get_vocab_size(with_added_tokens=True),
        "cases": text_cases(tiny, tiny_texts, len(tiny_texts)),
        "invalid_utf8": invalid_cases(tiny, INVALID_UTF8[:10]),
        "decode": decode_cases(tiny, decode_id_lists(tiny, rng)),
        "variants": tiny_variants(tiny_text),
    })
    print(f"tiny_cases.json: {len(tiny_texts)} texts")

    # Chat template, rendered by transformers (jinja2) from the tiny tokenizer directory.
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(os.path.join(out, "tiny"))
    assert hf.chat_template == CHAT_TEMPLATE
    chat = []
    for name, messages, gen in CHAT_CONVERSATIONS:
        text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        ids = tiny.encode(text, add_special_tokens=False).ids
        chat.append({"name": name, "messages": messages, "add_generation_prompt": gen, "rendered": text,
                     "tiny_ids": ids})
    dump("chat_cases.json", {"generator": "tools/make_tokenizer_fixtures.py", "bos_token": "<bos>",
                             "cases": chat})
    print(f"chat_cases.json: {len(chat)} conversations")


if __name__ == "__main__":
    sys.exit(main())
