"""SentenceSegmenter on a table of texts: the same segments fed whole, split anywhere, by char, at random."""

import random

import pytest

from tests.segmenter_helpers import segment_pieces, segment_whole

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
