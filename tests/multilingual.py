"""Seeded multilingual and adversarial texts for tokenizer identity tests."""

from __future__ import annotations

import json
import os
import random

EXAMPLE_CORPUS = os.path.join(os.path.dirname(__file__), "..", "qwen_data", "examples", "corpus.jsonl")

# Literal added-token strings of every flavour, and near misses.
SPECIAL_LITERALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_pad|>", "<|fim_prefix|>", "<tool_call>",
    "</tool_call>", "<think>", "</think>", "<tool_response>", "<|im_start|>assistant\n", "<|im_end", "<think",
]

_ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严",
    "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソ",
    "가나다라마바사아자차카타파하한국어문장입니다",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГД",
    "αβγδεζηθικλμνξοπρστυφχψω",
    "अआइईउऊएऐओऔकखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह",
    "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßœ",
]
_COMBINING = ["\u0301", "\u0300", "\u0308", "\u030a", "\u0327", "\u0323", "\u0302"]
_ODDITIES = ["\u00a0", "\u00a0\u00a0\u00a0", "\u3000", "\u200b", "\u200d", "\ufeff", "\t", "\r\n", "\n\n\n",
             "        ", " " * 37, "\u2028", "😀", "👩‍💻", "👍🏽", "🇯🇵", "🏳️‍🌈", "\U0001f9ea", "Å", "ﬁ", "①", "Ⅻ", "２０２４"]
_CODE = ["def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) { a[i] = b[i] * 2; }",
         "    if err != nil {\n\t\treturn err\n\t}\n", "SELECT * FROM t WHERE id IN (1, 2, 3);",
         "x = [1,2,3]  # comment\n\n\n", "https://example.com/a?b=c&d=e#f", "3.14159 2,718 1e-9 0xFF"]


def random_text(rng: random.Random, specials: bool = True) -> str:
    parts = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.45:
            alphabet = rng.choice(_ALPHABETS)
            words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9))) for _ in range(rng.randint(1, 8))]
            parts.append(" ".join(words))
        elif kind < 0.6:
            base = rng.choice(_ALPHABETS[0] + _ALPHABETS[8])
            parts.append(base + "".join(rng.choice(_COMBINING) for _ in range(rng.randint(1, 3))))
        elif kind < 0.8:
            parts.append(rng.choice(_ODDITIES))
        elif kind < 0.92 or not specials:
            parts.append(rng.choice(_CODE))
        else:
            parts.append(rng.choice(SPECIAL_LITERALS))
    return rng.choice(["", " ", "\n"]).join(parts)


def example_texts() -> list[str]:
    with open(EXAMPLE_CORPUS, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def corpus(n: int = 400, seed: int = 0, specials: bool = True) -> list[str]:
    rng = random.Random(seed)
    return example_texts() + [random_text(rng, specials) for _ in range(n)]
