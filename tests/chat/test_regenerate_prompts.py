"""Prompts under regeneration (issue 36 class 11): a conversation ending with a user turn and chat
prepare's own eval records get their answers generated; a record with nothing to answer is never
written as regenerated; a run that keeps nothing exits 2 with the reason (class 10). Against an
echo server on a thread of the test process."""

import orjson

from fuelline.chat.regenerate import RegenerateConfig, regenerate
from fuelline.serve.echo import echo_answer

from .test_regenerate import FAST_CLIENT, cli, echo_servers, read, regenerate_args, write

ENDS_WITH_USER = {"id": "open", "conversations": [
    {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "old"}, {"role": "user", "content": "Color?"}]}
PROMPT = {"id": "prompt", "conversations": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "Name a river."}]}
NOTHING = [{"id": "system-only", "conversations": [{"role": "system", "content": "Be brief."}]},
           {"id": "system-only-2", "conversations": [{"role": "system", "content": "Answer in French."}]}]
# Not records at all under the chat record contract: refused before any request (issue 35).
EMPTY = [{"id": "empty", "conversations": []}, {"id": "no-turns", "turns": []}]


def eval_records(tmp_path):
    """chat prepare's own eval output for one two-exchange ShareGPT conversation: {id, turns}."""
    raw = write(tmp_path / "raw.jsonl", [{"id": "mt", "conversations": [
        {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"},
        {"from": "human", "value": "Name a color"}, {"from": "gpt", "value": "Red"}]}])
    result = cli("chat", "prepare", "-i", str(raw), "--train-output", str(tmp_path / "train.jsonl"),
                 "--eval-output", str(tmp_path / "eval.jsonl"), "--test-size", "0.999", "-q")
    assert result.exit_code == 0, result.output
    assert read(tmp_path / "eval.jsonl") == {"mt": {"id": "mt", "turns": ["Hi", "Name a color"]}}
    return tmp_path / "eval.jsonl"


def test_prompts_get_their_answers_and_records_with_nothing_to_answer_are_dropped(tmp_path):
    """The reproducer: conversations ending with a user turn were written marked `regenerated` with no
    request made ("in 6 out 6, requests 0"), and prepare's eval output was refused."""
    source = write(tmp_path / "in.jsonl", [ENDS_WITH_USER, PROMPT, *NOTHING])
    evals = eval_records(tmp_path)
    with echo_servers((),) as urls:
        result = cli(*regenerate_args(source, tmp_path / "out.jsonl", urls, "-i", str(evals)))
    assert result.exit_code == 0, result.stderr
    out = read(tmp_path / "out.jsonl")
    assert sorted(out) == ["mt", "open", "prompt"]
    turns = out["open"]["conversations"]  # every answer regenerated in order, the missing one appended
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant"]
    assert turns[1]["content"] == echo_answer(turns[:1]) and turns[3]["content"] == echo_answer(turns[:3])
    assert out["open"]["meta"]["regenerated"]["answers_added"] == 1
    assert out["prompt"]["conversations"][2] == {"role": "assistant", "content": echo_answer(PROMPT["conversations"])}
    mt = out["mt"]  # the eval record became the chat record of its user turns, each answered in order
    assert set(mt) == {"id", "conversations", "meta"}
    assert [t["content"] for t in mt["conversations"][::2]] == ["Hi", "Name a color"]
    for k in (1, 3):
        assert mt["conversations"][k] == {"role": "assistant", "content": echo_answer(mt["conversations"][:k])}
    assert mt["meta"]["regenerated"]["turn_indexes"] == [1, 3] and mt["meta"]["regenerated"]["answers_added"] == 2
    errors = {e["id"]: e for e in map(orjson.loads, (tmp_path / "out.jsonl.errors").read_bytes().splitlines())}
    assert sorted(errors) == sorted(r["id"] for r in NOTHING)
    assert {e["reason"] for e in errors.values()} == {"nothing_to_regenerate"}
    assert "(system)" in errors["system-only"]["detail"]
    stats = orjson.loads((tmp_path / "out.stats.json").read_bytes())
    assert (stats["records_in"], stats["records_out"], stats["dropped"]) == (5, 3, {"nothing_to_regenerate": 2})
    assert stats["counters"]["requests"] == 2 + 1 + 2
    assert "nothing_to_regenerate 2" in result.stdout


def test_a_resumed_run_keeps_the_decision_and_counts_it_again(tmp_path):
    source = write(tmp_path / "in.jsonl", [PROMPT, *NOTHING])
    config = RegenerateConfig("echo", client=FAST_CLIENT)
    with echo_servers((),) as urls:
        first = regenerate([source], tmp_path / "out.jsonl", urls, config, progress=False)
        again = regenerate([source], tmp_path / "out.jsonl", urls, config, resume=True, progress=False)
    assert again["counters"]["requests"] == 0 and again["dropped"] == first["dropped"] == {"nothing_to_regenerate": 2}
    assert again["records_in"] == first["records_in"] == 3 and len(read(tmp_path / "out.jsonl")) == 1


def test_a_run_that_keeps_nothing_exits_2_with_the_reason(tmp_path):
    source = write(tmp_path / "in.jsonl", NOTHING)
    with echo_servers((),) as urls:
        result = cli(*regenerate_args(source, tmp_path / "out.jsonl", urls))
    assert result.exit_code == 2, result.output
    assert "regenerate kept none of its 2 records (dropped: nothing_to_regenerate 2)" in result.stderr
    assert "id system-only: no assistant turn" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out.jsonl").read_bytes()


def test_an_empty_conversation_is_refused_before_any_request(tmp_path):
    """Regeneration let an empty `conversations` list (or eval `turns`) through, which every later step refuses:
    now it stops the run at its line, under the record contract's reason, before the records after it are sent."""
    for k, empty in enumerate(EMPTY):
        source = write(tmp_path / f"in-{k}.jsonl", [empty, PROMPT])
        with echo_servers((),) as urls:
            result = cli(*regenerate_args(source, tmp_path / f"out-{k}.jsonl", urls))
        assert result.exit_code == 2 and "Traceback" not in result.stderr
        assert f"in-{k}.jsonl:1: " in result.stderr and "has no turn (empty_conversation)" in result.stderr
        assert not (tmp_path / f"out-{k}.jsonl").exists()
