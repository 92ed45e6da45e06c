import pytest

from cosyvoice.text.numbers import (
    english_cardinal,
    english_digits,
    english_ordinal,
    spell_numbers_en,
    spell_numbers_zh,
    zh_cardinal,
    zh_digits,
)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (0, "zero"),
        (7, "seven"),
        (13, "thirteen"),
        (40, "forty"),
        (99, "ninety-nine"),
        (100, "one hundred"),
        (101, "one hundred and one"),
        (1005, "one thousand and five"),
        (2024, "two thousand and twenty-four"),
        (1100, "one thousand, one hundred"),
        (1234567, "one million, two hundred and thirty-four thousand, five hundred and sixty-seven"),
        (-3, "minus three"),
    ],
)
def test_english_cardinal(value: int, words: str) -> None:
    assert english_cardinal(value) == words


@pytest.mark.parametrize(
    ("value", "words"),
    [(1, "first"), (2, "second"), (3, "third"), (12, "twelfth"), (20, "twentieth"), (21, "twenty-first"),
     (75, "seventy-fifth"), (100, "one hundredth"), (108, "one hundred and eighth")],
)  # fmt: skip
def test_english_ordinal(value: int, words: str) -> None:
    assert english_ordinal(value) == words


@pytest.mark.parametrize(
    ("digits", "words"),
    [
        ("0", "零"),
        ("10", "十"),
        ("15", "十五"),
        ("20", "二十"),
        ("105", "一百零五"),
        ("110", "一百一十"),
        ("1005", "一千零五"),
        ("10000", "一万"),
        ("100005", "十万零五"),
        ("120000", "十二万"),
        ("100010000", "一亿零一万"),
        ("12345", "一万二千三百四十五"),
    ],
)
def test_zh_cardinal(digits: str, words: str) -> None:
    assert zh_cardinal(digits) == words


def test_digit_readings() -> None:
    assert zh_digits("2024") == "二零二四"
    assert english_digits("007") == "zero zero seven"


def test_spell_numbers_zh_contexts() -> None:
    assert spell_numbers_zh("2024年3月15日") == "二零二四年三月十五日"
    assert spell_numbers_zh("3.5公斤") == "三点五公斤"
    assert spell_numbers_zh("50%的人") == "百分之五十的人"
    assert spell_numbers_zh("¥42.80") == "四十二点八零元"
    assert spell_numbers_zh("8:30出发") == "八点三十分出发"
    assert spell_numbers_zh("电话13812345678") == "电话一三八一二三四五六七八"
    assert spell_numbers_zh("没有数字") == "没有数字"


def test_spell_numbers_en_contexts() -> None:
    assert spell_numbers_en("I have 3 apples") == "I have three apples"
    assert spell_numbers_en("the 75th anniversary") == "the seventy-fifth anniversary"
    assert spell_numbers_en("3.5% off") == "three point five percent off"
    assert spell_numbers_en("pay $6 at 8:00") == "pay six dollars at eight o'clock"
    assert spell_numbers_en("at 9:05") == "at nine oh five"
