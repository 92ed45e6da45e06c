import pytest

from gateway.text_cleaning import clean_for_speech, first_emoji

CLEAN_CASES = [
    # emoji
    ("好的😊！", "好的！"),
    ("Great 👍 job", "Great job"),
    ("skin tone 👍🏽 gone", "skin tone gone"),
    ("family 👨\u200d👩\u200d👧 gone", "family gone"),
    ("heart ❤️ and bare ❤ gone", "heart and bare gone"),
    ("flag 🇨🇳 gone", "flag gone"),
    ("england 🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f gone", "england gone"),
    ("keycap 1️⃣ gone", "keycap gone"),
    ("rainbow flag 🏳️\u200d🌈 gone", "rainbow flag gone"),
    ("太棒了🎉🎉🎉", "太棒了"),
    ("© 2024 Acme™", "© 2024 Acme™"),
    # markdown
    ("# 标题", "标题"),
    ("### Heading ###", "Heading"),
    ("**粗体**和*斜体*还有__下划线__", "粗体和斜体还有下划线"),
    ("this is **bold** and _italic_ text", "this is bold and italic text"),
    ("***both***", "both"),
    ("~~删除线~~", "删除线"),
    ("用 `print()` 打印", "用 print() 打印"),
    ("`__init__` method", "__init__ method"),
    ("see [the docs](https://example.com/a_b) now", "see the docs now"),
    ("logo ![alt text](logo.png) here", "logo here"),
    ("[参考][1]资料", "参考资料"),
    ("- 第一项", "第一项"),
    ("* star item", "star item"),
    ("+ plus item", "plus item"),
    ("1. first", "first"),
    ("12) twelfth", "twelfth"),
    ("- [x] done task", "done task"),
    ("> 引用的话", "引用的话"),
    ("> > nested quote", "nested quote"),
    ("| 名称 | 价格 |\n|:---|---:|\n| 苹果 | 5元 |", "名称，价格苹果，5元"),
    ("| Name | Price |\n| --- | --- |\n| Apple | 5 |", "Name, Price Apple, 5"),
    ("```python\nprint(1)\n```", "print(1)"),
    ("---", ""),
    ("\\*literal stars\\*", "*literal stars*"),
    ("line<br>break", "line break"),
    ("<https://example.com>", "https://example.com"),
    # text that must survive
    ("3*4=12", "3*4=12"),
    ("2**10 is 1024", "2**10 is 1024"),
    ("a * b", "a * b"),
    ("f(x)*2", "f(x)*2"),
    ("a_b and snake_case_name", "a_b and snake_case_name"),
    ("C++ and C#", "C++ and C#"),
    ("#1 fan", "#1 fan"),
    ("3 > 2 is true", "3 > 2 is true"),
    ("x - y = 1", "x - y = 1"),
    ("visit https://example.com/a_b_c?q=1&r=2 now", "visit https://example.com/a_b_c?q=1&r=2 now"),
    ("www.example.com/__x__", "www.example.com/__x__"),
    ("mail li_wei@example.com.", "mail li_wei@example.com."),
    ("好的~", "好的~"),
    ("温度是-5度", "温度是-5度"),
    # whitespace
    ("  Hello \t\n  world  ", "Hello world"),
    ("第一行\n第二行", "第一行第二行"),
    ("中文 \n 中文。 English", "中文中文。 English"),
    ("你好 world", "你好 world"),
    ("한국어 단어", "한국어 단어"),
    ("\u200b零宽\ufeff字符", "零宽字符"),
    ("", ""),
    ("😊", ""),
]


@pytest.mark.parametrize(("text", "expected"), CLEAN_CASES)
def test_clean_for_speech(text, expected):
    assert clean_for_speech(text) == expected


def test_clean_rejects_non_text():
    with pytest.raises(TypeError):
        clean_for_speech(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("今天天气真好😊！", "😊"),
        ("no emoji here", None),
        ("", None),
        ("first 😂 then 😭", "😂"),
        ("thumbs 👍🏽 up", "👍🏽"),
        ("a ☺️ smile", "☺️"),
        ("family 👨\u200d👩\u200d👧!", "👨\u200d👩\u200d👧"),
        ("flag 🇨🇳", "🇨🇳"),
        ("keycap 1️⃣", "1️⃣"),
        ("© 2024 then 🤔", "🤔"),
        ("™️ as emoji", "™️"),
    ],
)
def test_first_emoji(text, expected):
    assert first_emoji(text) == expected
