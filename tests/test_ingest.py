from fuelline.ingest import IngestConfig, IngestStage
from fuelline.records import Drop, Location, fallback_id

HERE = Location("/data/a/poems.jsonl", 7)


def test_list_text_is_joined_and_other_fields_become_meta():
    stage = IngestStage(IngestConfig(text_key="paragraphs"))
    doc = stage.apply({"id": 5, "paragraphs": ["一行", "二行"], "author": "李白"}, HERE)
    assert doc == {"id": "5", "text": "一行\n二行", "meta": {"author": "李白"}}


def test_missing_id_falls_back_to_a_hash_of_file_name_and_line():
    doc = IngestStage().apply({"text": "some text"}, HERE)
    assert doc["id"] == fallback_id("elsewhere/poems.jsonl", 7) != fallback_id("poems.jsonl", 8)


def test_drops_name_their_reason():
    stage = IngestStage(IngestConfig(min_chars=5))
    assert stage.apply({"body": "x"}, HERE) == Drop("missing_text", "no field 'text'")
    assert stage.apply({"text": 3}, HERE).reason == "bad_text_type"
    assert stage.apply({"text": " \n "}, HERE).reason == "empty_text"
    assert stage.apply({"text": "abc"}, HERE).reason == "too_short"


def test_meta_keys_select_fields():
    doc = IngestStage(IngestConfig(meta_keys=["a"])).apply({"text": "hello", "a": 1, "b": 2}, HERE)
    assert doc["meta"] == {"a": 1}
