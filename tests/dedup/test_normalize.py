import pytest

from fuelline.dedup.normalize import Normalizer

CASES = {
    "床前明月光，\n疑是地上霜。": "床前明月光疑是地上霜",
    "Ｈｅｌｌｏ，　世界_!": "hello世界",  # full-width letters and space (NFKC), "_" is punctuation
    "ﬁne ① Ⅻ": "fine1xii",  # compatibility characters become letters and digits
    "ΑΣ ΟΔΟΣ": "ασοδος",  # one text after punctuation goes: only its last sigma is final
    "a_b-c d": "abcd",
    "": "",
    " ，。": "",
}


def test_a_batch_is_normalized_as_each_text_alone():
    normalize = Normalizer()
    assert normalize.many(list(CASES)) == list(CASES.values())
    assert [normalize(text) for text in CASES] == list(CASES.values())


@pytest.mark.parametrize("options", [{"lowercase": False}, {"punctuation": False}, {"unicode": False}])
def test_each_step_can_be_left_out(options):
    normalize = Normalizer(**options)
    got = dict(zip(CASES, normalize.many(list(CASES))))
    assert got == {text: normalize(text) for text in CASES}
    if options == {"lowercase": False}:
        assert got["Ｈｅｌｌｏ，　世界_!"] == "Hello世界"
    elif options == {"punctuation": False}:  # whitespace still goes
        assert got["a_b-c d"] == "a_b-cd"
    else:
        assert got["Ｈｅｌｌｏ，　世界_!"] == "ｈｅｌｌｏ世界"
