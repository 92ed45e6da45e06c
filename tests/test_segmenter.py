import random
import time

import pytest

from gateway.speech.segmenter import SentenceSegmenter

NO_COMMA = {"first_segment_at_comma": False}

# (id, text, constructor kwargs, expected segments)
CASES = [
    (
        "zh-basic",
        "你好，我是小智。今天天气很好！你呢？",
        {},
        ["你好，我是小智。", "今天天气很好！", "你呢？"],
    ),
    (
        "zh-first-comma",
        "好的，我们现在开始吧，第一步是打开电源。然后，按下按钮。",
        {},
        ["好的，我们现在开始吧，", "第一步是打开电源。", "然后，按下按钮。"],
    ),
    (
        "zh-first-comma-off",
        "好的，我们现在开始吧，第一步是打开电源。然后，按下按钮。",
        NO_COMMA,
        ["好的，我们现在开始吧，第一步是打开电源。", "然后，按下按钮。"],
    ),
    (
        "en-first-comma",
        "Sure, I can help with that. First, open the app.",
        {},
        ["Sure,", "I can help with that.", "First, open the app."],
    ),
    (
        "min-first-chars-2",
        "嗯，好的，没问题。",
        {"min_first_chars": 2},
        ["嗯，好的，", "没问题。"],
    ),
    ("min-first-chars-default", "嗯，好的，没问题。", {}, ["嗯，好的，没问题。"]),
    (
        "ascii-comma-between-cjk",
        "好的,我明白了,马上处理.",
        {},
        ["好的,我明白了,", "马上处理."],
    ),
    (
        "abbreviations",
        "Mr. Smith met Dr. Lee at 5 p.m. yesterday. They talked.",
        {},
        ["Mr. Smith met Dr. Lee at 5 p.m. yesterday.", "They talked."],
    ),
    (
        "ie-etc",
        "Bring fruit, i.e. apples, pears, etc. and water. OK?",
        {},
        ["Bring fruit,", "i.e. apples, pears, etc. and water.", "OK?"],
    ),
    (
        "us-and-no",
        "I moved to the U.S. last year. Room No. 5 is mine. No. I disagree.",
        {},
        ["I moved to the U.S. last year.", "Room No. 5 is mine.", "No.", "I disagree."],
    ),
    ("decimals", "It costs $29.99 now. Pi is 3.14159!", {}, ["It costs $29.99 now.", "Pi is 3.14159!"]),
    ("thousands", "There are 1,000 people here. Great.", {}, ["There are 1,000 people here.", "Great."]),
    ("clock-time", "会议在 10:30 开始。Don't be late!", {}, ["会议在 10:30 开始。", "Don't be late!"]),
    (
        "file-names",
        "Update to v2.1.3 and open config.yaml now. Done.",
        {},
        ["Update to v2.1.3 and open config.yaml now.", "Done."],
    ),
    ("lowercase-after-period", "Mix well. then add salt. Serve.", {}, ["Mix well. then add salt.", "Serve."]),
    (
        "ellipses",
        "Well... I think so. 嗯……好吧。等等…你说什么？",
        {},
        ["Well...", "I think so.", "嗯……", "好吧。", "等等…", "你说什么？"],
    ),
    (
        "ender-runs",
        "真的吗？！太好了！！！Really?! Yes.",
        {},
        ["真的吗？！", "太好了！！！", "Really?!", "Yes."],
    ),
    (
        "zh-closing-quote",
        "他说：“我今天很忙。”然后就走了。",
        {},
        ["他说：“我今天很忙。”", "然后就走了。"],
    ),
    ("corner-brackets", "她问：「你来吗？」我说：「来！」", {}, ["她问：「你来吗？」", "我说：「来！」"]),
    (
        "en-closing-quote-and-bracket",
        'She said "Stop!" Then she left (quickly.) Done.',
        {},
        ['She said "Stop!"', "Then she left (quickly.)", "Done."],
    ),
    (
        "mixed-no-spaces",
        "我喜欢Python.它很简单!Really? Yes.",
        {},
        ["我喜欢Python.", "它很简单!", "Really?", "Yes."],
    ),
    (
        "tech-names",
        "我们用 Node.js 和 Vue.js 开发。效果很好!",
        {},
        ["我们用 Node.js 和 Vue.js 开发。", "效果很好!"],
    ),
    (
        "url-with-query",
        "请访问 https://example.com/path?a=1&b=2 了解详情。谢谢！",
        {},
        ["请访问 https://example.com/path?a=1&b=2 了解详情。", "谢谢！"],
    ),
    (
        "url-at-sentence-end",
        "Go to www.example.com. It is free.",
        {},
        ["Go to www.example.com.", "It is free."],
    ),
    (
        "url-cjk-host",
        "打开 http://例子.中国/页面 然后登录。好的。",
        {},
        ["打开 http://例子.中国/页面 然后登录。", "好的。"],
    ),
    (
        "email",
        "邮箱是 li.wei@example.com。请发邮件!",
        {},
        ["邮箱是 li.wei@example.com。", "请发邮件!"],
    ),
    (
        "code-span",
        "运行 `os.path.join(a, b)` 就行。然后退出。",
        {},
        ["运行 os.path.join(a, b) 就行。", "然后退出。"],
    ),
    (
        "double-backtick-code-span",
        "Type ``a`b. c`` first. Then go.",
        {},
        ["Type a`b. c first.", "Then go."],
    ),
    (
        "list-items",
        "步骤如下：\n1. 打开电源。\n2. 按下按钮\n- 注意安全",
        {},
        ["步骤如下：", "打开电源。", "按下按钮", "注意安全"],
    ),
    (
        "numbered-english-list",
        "Steps:\n1. Open the lid. 2. Pour water.",
        {},
        ["Steps:", "Open the lid.", "Pour water."],
    ),
    (
        "heading-bold-emoji",
        "## 今日推荐\n**番茄炒蛋**很好吃😋！你想试试吗？",
        {},
        ["今日推荐", "番茄炒蛋很好吃！", "你想试试吗？"],
    ),
    (
        "semicolons",
        "第一，准备材料；第二，开始烹饪；最后，装盘。",
        {},
        ["第一，准备材料；", "第二，开始烹饪；", "最后，装盘。"],
    ),
    ("emoji-only-dropped", "😊\n好的！🎉🎉\n👍", {}, ["好的！"]),
    ("punctuation-only-dropped", "……\n。。。\n你好。", {}, ["你好。"]),
    ("emoji-around", "👋 Hi there! 我是小智😊。", {}, ["Hi there!", "我是小智。"]),
    ("blank-lines", "Hello there.\n\nHow are you?", {}, ["Hello there.", "How are you?"]),
    ("crlf", "第一行\r\n第二行", {}, ["第一行", "第二行"]),
    ("blockquote", "> 学而时习之。\n> 不亦说乎？", {}, ["学而时习之。", "不亦说乎？"]),
    (
        "table",
        "| 城市 | 温度 |\n|---|---|\n| 北京 | 25度 |",
        {},
        ["城市，温度", "北京，25度"],
    ),
    (
        "code-fence",
        "示例：\n```python\nprint('hi. there')\n```\n完成。",
        {},
        ["示例：", "print('hi. there')", "完成。"],
    ),
    (
        "markdown-link",
        "详见[官方文档](https://docs.example.com/a.b)。有问题再问我！",
        {},
        ["详见官方文档。", "有问题再问我！"],
    ),
    ("no-ender-at-end", "No punctuation at the end", {}, ["No punctuation at the end"]),
    ("force-split-at-space", "aaaa bbbb cccc dddd", {"max_chars": 10}, ["aaaa bbbb", "cccc dddd"]),
    (
        "force-split-at-comma",
        "我今天去了超市，买了很多东西，还有水果和蔬菜。",
        {"max_chars": 12, **NO_COMMA},
        ["我今天去了超市，", "买了很多东西，", "还有水果和蔬菜。"],
    ),
    ("force-split-hard", "一二三四五六七八九十十一", {"max_chars": 5}, ["一二三四五", "六七八九十", "十一"]),
    ("force-split-astral-cjk", "𠀀𠀁𠀂𠀃𠀄", {"max_chars": 2}, ["𠀀𠀁", "𠀂𠀃", "𠀄"]),
    (
        "force-split-keeps-graphemes",
        "\u1112\u1161\u11ab\u1112\u1161\u11ab",  # two decomposed 한
        {"max_chars": 4},
        ["\u1112\u1161\u11ab", "\u1112\u1161\u11ab"],
    ),
    # runs longer than max_chars: cut at the limit, the same however the text arrives
    ("dot-run-past-limit", "Hi" + "." * 30 + "Bye.", {"max_chars": 10}, ["Hi........", "..Bye."]),
    (
        "backtick-run-past-limit",
        "Hi " + "`" * 30 + "code` done.",
        {"max_chars": 10},
        ["Hi", "code`", "done."],
    ),
    (
        "full-stop-run-past-limit",
        "好" + "。" * 30 + "吗？",
        {"max_chars": 10},
        ["好。。。。。。。。。", "吗？"],
    ),
    ("closer-run-past-limit", "Well." + ")" * 30 + " Yes.", {"max_chars": 10}, ["Well.)))))", "))))) Yes."]),
    (
        "comma-run-past-limit",
        "嗯" + "，" * 30 + "好的好的，走吧。",
        {"max_chars": 10},
        ["嗯，，，，，，，，，", "，好的好的，走吧。"],
    ),
    (
        "spaces-past-limit-after-abbreviation",
        "Mr." + " " * 30 + "smith went.",
        {"max_chars": 10},
        ["Mr.", "smith", "went."],
    ),
    ("spaces-past-limit-after-period", "Go." + " " * 30 + "Now.", {"max_chars": 10}, ["Go.", "Now."]),
]

IDS = [case[0] for case in CASES]


def segment_whole(text: str, kwargs: dict) -> list[str]:
    segmenter = SentenceSegmenter(**kwargs)
    return segmenter.push(text) + segmenter.flush()


def segment_pieces(pieces: list[str], kwargs: dict) -> list[str]:
    segmenter = SentenceSegmenter(**kwargs)
    segments: list[str] = []
    for piece in pieces:
        segments += segmenter.push(piece)
    return segments + segmenter.flush()


@pytest.mark.parametrize(("name", "text", "kwargs", "expected"), CASES, ids=IDS)
def test_segments(name, text, kwargs, expected):
    assert segment_whole(text, kwargs) == expected


@pytest.mark.parametrize(("name", "text", "kwargs", "expected"), CASES, ids=IDS)
def test_split_at_every_index_gives_same_segments(name, text, kwargs, expected):
    for index in range(len(text) + 1):
        assert segment_pieces([text[:index], text[index:]], kwargs) == expected, f"split at {index}"


@pytest.mark.parametrize(("name", "text", "kwargs", "expected"), CASES, ids=IDS)
def test_char_by_char_gives_same_segments(name, text, kwargs, expected):
    assert segment_pieces(list(text), kwargs) == expected


@pytest.mark.parametrize(("name", "text", "kwargs", "expected"), CASES, ids=IDS)
def test_random_chunking_gives_same_segments(name, text, kwargs, expected):
    rng = random.Random(name)
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(4, len(text) + 1)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert segment_pieces(pieces, kwargs) == expected, f"pieces {pieces}"


def test_segment_is_released_once_next_character_arrives():
    segmenter = SentenceSegmenter()
    assert segmenter.push("你好，我是小智。") == []
    assert segmenter.push("今") == ["你好，我是小智。"]
    assert segmenter.pending_text == "今"


def test_price_is_not_cut_before_decimals_arrive():
    segmenter = SentenceSegmenter()
    assert segmenter.push("It costs $29.") == []
    assert segmenter.push("99") == []
    assert segmenter.push(" now. And") == ["It costs $29.99 now."]
    assert segmenter.flush() == ["And"]


def test_period_waits_for_next_visible_character():
    segmenter = SentenceSegmenter()
    assert segmenter.push("Mix well.   ") == []
    assert segmenter.push("T") == ["Mix well."]


def test_comma_allowed_only_for_first_segment_of_each_turn():
    segmenter = SentenceSegmenter()
    assert segmenter.push("好的好的，没问题。那么，我们") == ["好的好的，", "没问题。"]
    assert segmenter.flush() == ["那么，我们"]
    # flush() ended the turn: the next turn's first segment may end at a comma again
    assert segmenter.push("没问题的，稍") == ["没问题的，"]


def test_dropped_segment_does_not_count_as_first():
    segmenter = SentenceSegmenter()
    assert segmenter.push("😊\n好的好的，稍等") == ["好的好的，"]


def test_clear_discards_pending_text_and_starts_new_turn():
    segmenter = SentenceSegmenter()
    assert segmenter.push("第一句话说完了。第二句") == ["第一句话说完了。"]
    segmenter.clear()
    assert segmenter.pending_text == ""
    assert segmenter.push("新的回答开始，然后") == ["新的回答开始，"]
    assert segmenter.flush() == ["然后"]


def test_flush_on_empty_segmenter():
    segmenter = SentenceSegmenter()
    assert segmenter.flush() == []
    assert segmenter.push("") == []
    assert segmenter.flush() == []


def test_no_segment_longer_than_max_chars():
    text = ("这是一段很长的文字没有任何标点符号" * 8) + " and some English words without stops " * 5
    for max_chars in (7, 20, 50):
        segments = segment_whole(text, {"max_chars": max_chars})
        assert all(len(segment) <= max_chars for segment in segments)
        assert "".join(segments).replace(" ", "") == text.replace(" ", "")


def test_code_span_is_never_split_inside():
    text = "先运行 `a = 1; b = 2. print(a)` 然后看结果。"
    assert segment_whole(text, {}) == ["先运行 a = 1; b = 2. print(a) 然后看结果。"]


@pytest.mark.parametrize("kwargs", [{"max_chars": 1}, {"max_chars": 0}, {"min_first_chars": -1}])
def test_bad_arguments_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        SentenceSegmenter(**kwargs)


def test_push_rejects_non_text():
    with pytest.raises(TypeError):
        SentenceSegmenter().push(b"bytes")  # type: ignore[arg-type]


# ---- linear time -------------------------------------------------------------------------------

# A device's typed text comes back through the echo LLM into the segmenter: 100k characters of each
# pattern must cost well under a second of CPU however they arrive (it was quadratic: 60,000 "."
# took ~24 s in 4-character deltas).
CPU_BUDGET_S = 1.0
PATHOLOGICAL = {
    "dots": "." * 100_000,
    "backticks": "`" * 100_000,
    "cjk-full-stops": "。" * 100_000,
    "exclamations": "！" * 100_000,
    "dots-and-spaces": ". " * 50_000,
    "ellipses-and-spaces": "... " * 25_000,
    "no-punctuation": "a" * 100_000,
    "words-no-punctuation": "word " * 20_000,
    "commas": "，" * 100_000,
    "period-then-spaces": "Hi." + " " * 100_000 + "x",
    "closers": "。" + "）" * 100_000,
    "open-code-span": "`" + "a. b. " * 16_000,
    "mixed-runs": "`..。。 ``" * 10_000,
}


@pytest.mark.parametrize("delta_chars", [None, 5], ids=["one-chunk", "5-char-deltas"])
@pytest.mark.parametrize("name", PATHOLOGICAL)
def test_pathological_text_is_segmented_in_linear_time(name, delta_chars):
    text = "You said: " + PATHOLOGICAL[name]
    step = delta_chars or len(text)
    segmenter = SentenceSegmenter()
    segments: list[str] = []
    start = time.process_time()
    for index in range(0, len(text), step):
        segments += segmenter.push(text[index : index + step])
        assert time.process_time() - start < CPU_BUDGET_S, f"over budget after {index} of {len(text)} chars"
    segments += segmenter.flush()
    assert time.process_time() - start < CPU_BUDGET_S
    assert segments[0] == "You said:"
    assert all(len(segment) <= 120 for segment in segments)
    assert len(segmenter.pending_text) == 0


def test_pending_text_stays_short_while_a_run_streams_in():
    segmenter = SentenceSegmenter(max_chars=50)
    for _ in range(10_000):
        segmenter.push("...")
        assert len(segmenter.pending_text) <= 50 + 3
