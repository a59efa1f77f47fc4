"""Bodies an attacker sends: every one is a 4xx problem naming the field, and nothing is stored.

Raw bytes, not ``json=``: the test client's encoder would refuse NaN or fold a 300-digit integer for us.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import func, select

from tests.api.support import BENCH, Api
from tuner import model_files
from tuner.demo import demo_traffic
from tuner.store.db import make_engine, make_session_factory
from tuner.store.models import JobRow, TrafficSampleRow


def tune_body(**fields: str) -> bytes:
    """A valid POST /tune body with some fields replaced by raw JSON text."""
    parts = {
        "model": '"org/model"',
        "engine": '"simulated"',
        "concurrency": "[1, 8]",
        "traffic": '[{"prompt": "hello there", "output_tokens": 8}]',
        **fields,
    }
    return ("{" + ", ".join(f'"{k}": {v}' for k, v in parts.items()) + "}").encode()


def stored(api: Api) -> tuple[int, int]:
    engine = make_engine(api.settings.db_url)
    try:
        with make_session_factory(engine)() as s:
            jobs = s.scalar(select(func.count()).select_from(JobRow))
            samples = s.scalar(select(func.count()).select_from(TrafficSampleRow))
    finally:
        engine.dispose()
    return int(jobs or 0), int(samples or 0)


def post_raw(api: Api, path: str, data: bytes, content_type: str = "application/json"):  # noqa: ANN201
    return api.client.post(path, content=data, headers=api.tune | {"Content-Type": content_type})


def deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"hf_config": '{"a": ' * 300 + "1" + "}" * 300}, "hf_config"),
        ({"hf_config": '{"x": ' + deep(1000) + "}"}, "hf_config"),
        ({"hf_config": '{"x": ' + deep(1100) + "}"}, "body"),  # past orjson's own limit: refused at parse
        ({"traffic": '[{"messages": ' + deep(300) + "}]"}, "traffic.0.messages"),
        ({"seed": "9" * 400}, "body"),  # beyond a double: refused at parse
        ({"seed": str(2**40)}, "seed"),
        ({"seed": "-1"}, "seed"),
        ({"seed": "123456789012345678901234567890"}, "seed"),  # read as a double, then out of range
        ({"hf_config": '{"n": 18446744073709551615}'}, "hf_config.n"),  # unsigned 64-bit: past what SQL holds
        ({"request_rate": "[NaN]", "concurrency": "null"}, "body"),
        ({"request_rate": "[Infinity]", "concurrency": "null"}, "body"),
        ({"hf_config": '{"v": 1e400}'}, "body"),
        ({"traffic": '[{"prompt": "hi", "arrival_s": 1e300}]'}, "traffic.0"),
        ({"traffic": '[{"prompt": "a\\u0000b"}]'}, "traffic.0.prompt"),
        ({"hf_config": '{"k\\u0000": 1}'}, "hf_config"),
        ({"request_rate": "[" + ", ".join(str(1 + i) for i in range(17)) + "]", "concurrency": "null"}, "request_rate"),
        ({"concurrency": "[" + ", ".join(str(1 + i) for i in range(17)) + "]"}, "concurrency"),
        (
            {"search": '{"methods": ["draft_model"], "drafts": {"draft_model": [' + ", ".join(['"d"'] * 9) + "]}}"},
            "search.drafts",
        ),
        ({"level_weights": "{" + ", ".join(f'"c{i}": 1' for i in range(17)) + "}"}, "level_weights"),
    ],
)
def test_hostile_tune_bodies_are_422_naming_the_field(api: Api, fields: dict[str, str], field: str) -> None:
    before = stored(api)
    r = post_raw(api, "/tune", tune_body(**fields))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert any(e["field"] == field or e["field"].startswith(field + ".") for e in problem["errors"]), problem
    assert stored(api) == before


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "hi", "arrival_s": Infinity}', "invalid JSON"),
        ('{"prompt": "hi", "arrival_s": 1e300}', "arrival_s"),
        ('{"prompt": "a\\u0000b"}', "NUL"),
        ('{"prompt": "hi", "output_tokens": 99999999999999999999999}', "output_tokens"),
        ('{"messages": ' + deep(200) + "}", "nested deeper"),
        ('{"messages": [{"role": 3, "content": "x"}]}', "role"),
    ],
)
def test_hostile_sample_lines_are_422_naming_the_line(api: Api, line: str, message: str) -> None:
    good = '{"prompt": "fine", "output_tokens": 4}'
    before = stored(api)
    r = post_raw(api, "/traffic", f"{good}\n{line}\n".encode(), "application/x-ndjson")
    assert r.status_code == 422, r.text
    errors = r.json()["errors"]
    assert [e["line"] for e in errors] == [2], errors
    assert message in errors[0]["message"], errors
    assert stored(api) == before


def test_a_json_sample_names_the_item(api: Api) -> None:
    doc = '[{"prompt": "ok"}, {"prompt": "bad", "temperature": ' + "1" * 30 + "}]"
    r = post_raw(api, "/traffic", doc.encode())
    assert r.status_code == 422, r.text
    assert [e["line"] for e in r.json()["errors"]] == [2]


def test_limits_leave_ordinary_bodies_alone(api: Api) -> None:
    nested = '{"text_config": {"rope_scaling": {"factor": 8.0, "type": "llama3"}}, "vocab_size": 32000}'
    r = post_raw(api, "/tune", tune_body(hf_config=nested, seed=str(2**32 - 1)))
    assert r.status_code == 202, r.text
    ok = "\n".join(
        '{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 8}' for _ in BENCH
    )
    assert post_raw(api, "/traffic", ok.encode(), "application/x-ndjson").status_code == 201


def _local_model(root: Path, context: int) -> Path:
    """A model directory as a worker holds one: config.json and a word-level tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = root / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": context}))
    vocab = {"[UNK]": 0} | {w: i + 1 for i, w in enumerate(["hello", "there", "word"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(model / "tokenizer.json"))
    return model


def test_requests_longer_than_the_context_are_found_at_submit(api: Api, tmp_path: Path) -> None:
    model = _local_model(tmp_path, context=64)
    api.client.app.state.settings = api.settings.model_copy(update={"model_roots": str(tmp_path / "models")})  # type: ignore[attr-defined]
    fits = {"prompt": "hello there", "output_tokens": 32}
    long_prompt = {"prompt": " ".join(["word"] * 60), "output_tokens": 8}  # 60 tokens by the tokenizer, 68 in all
    long_output = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 64}
    body = {"model": str(model), "engine": "simulated", "concurrency": [1], "traffic": [fits, long_prompt, long_output]}
    before = stored(api)
    r = api.client.post("/tune", json=body, headers=api.tune)
    assert r.status_code == 422, r.text
    assert [e["item"] for e in r.json()["errors"]] == [1, 2]
    assert "64-token context" in r.json()["detail"]
    assert stored(api) == before
    # the job's own max_model_len is the servers' context, and it is checked too (without a tokenizer: outputs)
    body |= {"model": "org/remote", "traffic": [fits], "serving": {"args": {"max_model_len": 32}}}
    r = api.client.post("/tune", json=body, headers=api.tune)
    assert r.status_code == 422 and [e["item"] for e in r.json()["errors"]] == [0], r.text
    body["serving"] = {"args": {"max_model_len": 4096}}
    assert api.client.post("/tune", json=body, headers=api.tune).status_code == 202


def test_the_demo_sample_leaves_out_what_the_models_context_cannot_hold(api: Api, tmp_path: Path) -> None:
    # `tuner demo` on a local model reads its context and tokenizer as the API does, so the job it posts is
    # never refused for its length; and what it left out is exactly what the API would have refused.
    model = _local_model(tmp_path, context=512)
    api.client.app.state.settings = api.settings.model_copy(update={"model_roots": str(tmp_path / "models")})  # type: ignore[attr-defined]
    context, count = model_files.context_length({}, None, model), model_files.token_counter(model)
    assert context == 512 and count is not None
    items, dropped = demo_traffic(64, context, count)
    assert len(items) == 64 and dropped > 0
    body = {"model": str(model), "engine": "simulated", "concurrency": [1], "traffic": items}
    assert api.client.post("/tune", json=body, headers=api.tune).status_code == 202
    unfiltered, none_dropped = demo_traffic(64 + dropped)
    assert none_dropped == 0
    r = api.client.post("/tune", json=body | {"traffic": unfiltered}, headers=api.tune)
    assert r.status_code == 422 and len(r.json()["errors"]) == dropped, r.text
