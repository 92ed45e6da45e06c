"""Per-sentence cost of text normalisation (``tts.text_normalization``): p50/p95 microseconds.

The corpus is sentences as an LLM writes them in replies, Chinese and English, with and without
numbers, dates, units, money, phone numbers and versions. Each mode is built once (the wetext FSTs
load there, as at server start-up; the load time is printed) and then timed sentence by sentence.

    python scripts/bench_text_normalization.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tts_engine.text_normalization import TextNormalizer  # noqa: E402

CORPUS = [
    "好的，我来帮你查一下明天的天气。",
    "明天北京晴，最高气温25℃，最低-3°C，空气质量良。",
    "会议定在2026-11-24下午3:30，地点在3楼的会议室。",
    "这款iPhone 15 Pro售价7999元，比去年便宜了大约10%。",
    "你的快递预计3-5个工作日送达，运费是¥12.5。",
    "如需帮助，请拨打客服热线400-800-1234或发邮件到help@example.com。",
    "新版本v2.4.2修复了12个问题，下载地址是https://www.example.com/download。",
    "从家到公司大约5.5km，骑车需要20分钟左右。",
    "截至2025年底，用户数已经超过1,000,000人，其中1/3来自海外。",
    "我觉得这个问题可以分成三步来解决。",
    "首先，把面粉和水按照2:1的比例混合，然后静置30分钟。",
    "GPT-4和其他大模型相比，在数学推理上提高了约15.6%。",
    "今天是11月24日星期二，农历十月初五。",
    "番茄炒蛋需要2个番茄、3个鸡蛋和少许盐。",
    "The meeting starts at 3:30 pm on 2026-11-24.",
    "It costs $1,234.56 including tax, about 15% more than last year.",
    "The temperature will drop to -3°C tonight, so bring a coat.",
    "Sure! Here is a quick summary of what I found.",
    "Version v2.4.2 fixes 12 bugs and improves speed by 30%.",
    "Call 555-123-4567 or e-mail support@example.com for help.",
    "The package weighs 3.5kg and measures 40 x 30 x 20 cm.",
    "I think you should rest for 2 or 3 days.",
]


def measure(normalizer: TextNormalizer, rounds: int) -> list[float]:
    for sentence in CORPUS:  # warm-up: first-call costs are not per-sentence costs
        normalizer(sentence)
    costs = []
    for _ in range(rounds):
        for sentence in CORPUS:
            start = time.perf_counter_ns()
            normalizer(sentence)
            costs.append((time.perf_counter_ns() - start) / 1000)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20, help="passes over the corpus (default 20)")
    args = parser.parse_args()
    print(f"{len(CORPUS)} sentences x {args.rounds} rounds")
    print(f"{'mode':<8} {'load ms':>8} {'p50 us':>8} {'p95 us':>8} {'max us':>8}")
    for mode in ("wetext", "basic"):
        start = time.perf_counter()
        normalizer = TextNormalizer(mode)
        load_ms = (time.perf_counter() - start) * 1000
        if normalizer.mode != mode:
            print(f"{mode:<8} not available (fell back to {normalizer.mode})")
            continue
        costs = sorted(measure(normalizer, args.rounds))
        p95 = costs[min(len(costs) - 1, round(0.95 * (len(costs) - 1)))]
        print(f"{mode:<8} {load_ms:8.1f} {statistics.median(costs):8.0f} {p95:8.0f} {costs[-1]:8.0f}")


if __name__ == "__main__":
    main()
