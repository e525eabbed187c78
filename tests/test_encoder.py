"""Tests for stream.encoder: offline, on a tiny BERTweet-like model and the packaged MiniLM."""

from __future__ import annotations

import gzip
import itertools
import json
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    BertweetTokenizer,
    RobertaForMaskedLM,
    RobertaModel,
)

from workers.adapters.encoding.bert_forward import packable_layers
from workers.adapters.encoding.cpu_fast import (
    CALIBRATION_TEXTS,
    Int8Linear,
    Int8QKVSlice,
    cpu_supports_bf16,
    cpu_supports_int8,
    packed_forward,
    quantize_linear_layers,
    record_linear_input_absmax,
)
from workers.adapters.encoding.encoder import DEFAULT_MODEL, Encoder
from workers.adapters.encoding.gpu_batching import (
    Window,
    batches_from_windows,
    build_batch,
    pack_rows,
    restore_order,
    token_budget_batches,
)
from workers.adapters.encoding.model_loading import resolve_dtype
from workers.adapters.encoding.prefetch import chunked, prefetch
from workers.adapters.encoding.tokenizer_loading import MINILM, resolve_model
from workers.dev.tiny_models import build_tiny_bertweet

TWEETS = [
    "Please help the flood victims in Queensland https://t.co/abc123 @redcross #qldflood",
    "earthquake",
    "",
    "Praying for everyone in the Philippines tonight 🙏 #typhoon #prayforthephilippines",
    "RT @user: BREAKING explosion reported near the train station, people injured",
    "rain rain rain",
    "heeeeello world!!! covid19 cases today ... what a terrible week",
    "Donate to the Red Cross to support the earthquake relief in Guatemala http://x.co/y",
]


def cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A neutral directory name: BERTweet must be recognised without "bertweet" in it.
    return build_tiny_bertweet(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tiny32(tiny_dir: Path) -> Encoder:
    return Encoder(str(tiny_dir), dtype="float32", batch_size=3)


@pytest.fixture(scope="module")
def minilm32() -> Encoder:
    return Encoder(MINILM, dtype="float32")


# -- loading ------------------------------------------------------------


def test_tiny_model_loads_through_auto_classes(tiny_dir: Path, tiny32: Encoder) -> None:
    tok = AutoTokenizer.from_pretrained(str(tiny_dir), local_files_only=True)
    model = AutoModel.from_pretrained(str(tiny_dir), local_files_only=True)
    assert isinstance(tok, BertweetTokenizer)
    assert isinstance(model, RobertaModel)
    assert model.config.max_position_embeddings == 130  # 128 + RoBERTa padding offset
    assert isinstance(tiny32.tokenizer, BertweetTokenizer)
    assert isinstance(tiny32.model, RobertaModel)
    assert tiny32.dim == 32
    assert tiny32.model_id == str(tiny_dir)
    assert tiny32.device == torch.device("cpu")
    assert tiny32.dtype == torch.float32
    assert tiny32.max_length == 128


def test_bertweet_normalization_is_switched_on(tiny_dir: Path, tiny32: Encoder) -> None:
    # Saved with normalization off (as on the hub): the Encoder must turn it on.
    assert AutoTokenizer.from_pretrained(str(tiny_dir)).normalization is False
    assert tiny32.uses_tweet_normalization
    tokens = tiny32.tokenizer.tokenize("Look at this https://t.co/abc123 @someone 😢")
    assert "HTTPURL" in tokens
    assert "@USER" in tokens
    assert not any(t.startswith("http") or t.startswith("@some") for t in tokens)
    # The emoji is demojized to ":crying_face:" (then split into BPE pieces).
    assert ":crying_face:" in tiny32.tokenizer.convert_tokens_to_string(tokens)
    unk = tiny32.tokenizer.unk_token_id
    ids = tiny32.tokenizer.convert_tokens_to_ids(["HTTPURL", "@USER", "earthquake", "covid19"])
    assert unk not in ids


def test_bertweet_recognised_from_tokenizer_alone(tmp_path: Path) -> None:
    # No hint in the name or config.json: the loaded tokenizer class still gives it away.
    d = build_tiny_bertweet(tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("tokenizer_class")
    (d / "config.json").write_text(json.dumps(cfg))
    enc = Encoder(str(d), dtype="float32")
    assert enc.uses_tweet_normalization
    assert "HTTPURL" in enc.tokenizer.tokenize("see www.example.com")


def test_masked_lm_checkpoint_loads_without_pooler(tmp_path: Path) -> None:
    # The hub's BERTweet checkpoints are RobertaForMaskedLM: no pooler weights to load.
    d = build_tiny_bertweet(tmp_path / "mlm")
    RobertaForMaskedLM(AutoConfig.from_pretrained(str(d))).save_pretrained(str(d))
    enc = Encoder(str(d), dtype="float32")
    assert isinstance(enc.model, RobertaModel)
    assert enc.model.pooler is None
    assert enc.encode(["flood help"]).shape == (1, 32)


def test_max_length_capped_by_position_table(tiny_dir: Path) -> None:
    assert Encoder(str(tiny_dir), max_length=512).max_length == 128
    assert Encoder(str(tiny_dir), max_length=40).max_length == 40


def test_resolve_model_and_constants() -> None:
    assert DEFAULT_MODEL == "vinai/bertweet-base"
    assert resolve_model(DEFAULT_MODEL) == DEFAULT_MODEL
    assert resolve_model("vinai/bertweet-covid19-base-uncased") == ("vinai/bertweet-covid19-base-uncased")
    path = Path(resolve_model(MINILM))
    assert (path / "config.json").is_file()
    assert resolve_model("MiniLM") == str(path)


def test_resolve_dtype() -> None:
    cpu = torch.device("cpu")
    assert resolve_dtype("float32", cpu) == torch.float32
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype("int8", cpu) == torch.int8
    assert resolve_dtype("INT8", cpu) == torch.int8
    if cpu_supports_int8():
        expected = torch.int8
    elif cpu_supports_bf16():
        expected = torch.bfloat16
    else:
        expected = torch.float32
    assert resolve_dtype("auto", cpu) == expected
    with pytest.raises(ValueError):
        resolve_dtype("int4", cpu)
    with pytest.raises(ValueError, match="CPU only"):
        resolve_dtype("int8", torch.device("cuda"))


def test_bad_arguments(tiny_dir: Path, tiny32: Encoder) -> None:
    with pytest.raises(ValueError):
        Encoder(str(tiny_dir), pooling="max")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        tiny32.encode("a single string is not a batch")


# -- encoding -----------------------------------------------------------


def test_shape_dtype_unit_norm(tiny32: Encoder) -> None:
    v = tiny32.encode(TWEETS)
    assert v.shape == (len(TWEETS), 32)
    assert v.dtype == np.float32
    assert np.all(np.isfinite(v))
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    empty = tiny32.encode([])
    assert empty.shape == (0, 32)
    assert empty.dtype == np.float32


def test_order_preserved_despite_length_sorting(tiny32: Encoder) -> None:
    lengths = [len(ids) for ids in tiny32.tokenize(TWEETS)]
    assert lengths != sorted(lengths, reverse=True)  # the sort really permutes
    batched = tiny32.encode(TWEETS)  # batch_size 3: several padded batches
    single = np.stack([tiny32.encode([t])[0] for t in TWEETS])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    # Distinct texts give distinct rows, so a permutation could not pass unnoticed.
    sims = batched @ batched.T
    assert np.all(sims[~np.eye(len(TWEETS), dtype=bool)] < 0.999)


def test_progress_callback(tiny32: Encoder) -> None:
    calls: list[tuple[int, int]] = []
    tiny32.encode(TWEETS, batch_size=4, progress=lambda done, n: calls.append((done, n)))
    assert calls == [(4, len(TWEETS)), (8, len(TWEETS))]


def test_mean_and_cls_pooling_differ(tiny_dir: Path, tiny32: Encoder) -> None:
    cls = Encoder(str(tiny_dir), dtype="float32", pooling="cls")
    mean_v, cls_v = tiny32.encode(TWEETS), cls.encode(TWEETS)
    np.testing.assert_allclose(np.linalg.norm(cls_v, axis=1), 1.0, atol=1e-5)
    assert np.all(cos(mean_v, cls_v) < 0.99)


def test_truncation_at_128_tokens(tiny32: Encoder) -> None:
    long_a = "flood help " * 400
    long_b = "flood help " * 100 + "earthquake " * 300  # same first 126 tokens
    ids = tiny32.tokenize([long_a, long_b])
    assert [len(x) for x in ids] == [128, 128]
    assert ids[0][0] == tiny32.tokenizer.cls_token_id
    assert ids[0][-1] == tiny32.tokenizer.sep_token_id
    v = tiny32.encode([long_a, long_b, "flood"])
    assert np.all(np.isfinite(v))
    np.testing.assert_allclose(v[0], v[1], atol=1e-6)


def test_zero_vector_stays_zero(tiny_dir: Path) -> None:
    enc = Encoder(str(tiny_dir), dtype="float32")

    class Zeros(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
            return SimpleNamespace(last_hidden_state=torch.zeros(*input_ids.shape, 32))

    enc.model = Zeros()
    v = enc.encode(["flood", "help"])
    assert np.all(v == 0.0)


def test_bf16_agrees_with_fp32_on_tiny_model(tiny_dir: Path, tiny32: Encoder) -> None:
    bf16 = Encoder(str(tiny_dir), dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16
    v16 = bf16.encode(TWEETS)
    assert v16.dtype == np.float32
    assert cos(v16, tiny32.encode(TWEETS)).min() >= 0.99


@pytest.mark.parametrize("which", ["tiny", "minilm"])
def test_packed_forward_matches_transformers(which: str, tiny32: Encoder, minilm32: Encoder) -> None:
    # The encoder runs the layers itself on the real tokens only (no padding rows):
    # it must give what the transformers forward pass gives on those tokens.
    enc = tiny32 if which == "tiny" else minilm32
    layers = packable_layers(enc.model)
    config = enc.model.config  # a PretrainedConfig, which nn.Module's __getattr__ cannot type
    assert layers is not None and len(layers) == config.num_hidden_layers  # type: ignore[union-attr]
    for texts in (TWEETS, TWEETS[:1], [TWEETS[0]] * 3):  # padded, single, no padding at all
        input_ids, mask = enc._pad(enc.tokenize(texts))
        with torch.inference_mode():
            ref = enc.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
            got = packed_forward(enc.model, layers, input_ids, mask)
        real = mask.bool()
        torch.testing.assert_close(got[real], ref[real], rtol=1e-4, atol=1e-4)
        assert torch.all(got[~real] == 0)


def test_unusual_models_use_the_transformers_forward(tiny_dir: Path) -> None:
    enc = Encoder(str(tiny_dir), dtype="float32")
    enc.model.config.position_embedding_type = "relative_key"  # type: ignore[union-attr]
    assert packable_layers(enc.model) is None
    assert packable_layers(torch.nn.Linear(2, 2)) is None


# -- int8 path ----------------------------------------------------------


FEED = Path(__file__).resolve().parents[1] / "stream" / "data" / "crisislex-t26.jsonl.gz"


def feed_tweets(n: int) -> list[str]:
    """``n`` real tweets spread over the bundled feed (it is time-ordered by event)."""
    with gzip.open(FEED, "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    return texts[:: len(texts) // n][:n]


@pytest.fixture(scope="module")
def tiny8(tiny_dir: Path) -> Encoder:
    return Encoder(str(tiny_dir), dtype="int8", batch_size=3)


def test_int8_linear_matches_linear() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 40)
    x = torch.randn(2, 7, 48)
    x[..., 5] *= 30.0  # an outlier channel, as in real transformer activations
    with torch.no_grad():
        ref = lin(x)
    for absmax in (None, x.reshape(-1, 48).abs().amax(dim=0)):
        q = Int8Linear(lin, absmax)
        assert q.weight.dtype == torch.int8
        with torch.no_grad():
            y = q(x)
        assert y.shape == ref.shape and y.dtype == torch.float32
        assert float((y - ref).norm() / ref.norm()) < 0.02
    # Smoothing helps with the outlier channel.
    with torch.no_grad():
        err_plain = (Int8Linear(lin)(x) - ref).norm()
        err_smooth = (Int8Linear(lin, x.reshape(-1, 48).abs().amax(dim=0))(x) - ref).norm()
    assert err_smooth < err_plain
    # Rows are quantised independently: a row's result ignores the other rows.
    q = Int8Linear(lin)
    with torch.no_grad():
        torch.testing.assert_close(q(x[0, :1]), q(x.reshape(-1, 48))[:1], rtol=0, atol=0)
        assert q(torch.zeros(0, 48)).shape == (0, 40)
        assert torch.all(q(torch.zeros(3, 48)) == lin.bias)  # zero input: bias only
    no_bias = torch.nn.Linear(48, 40, bias=False)
    with torch.no_grad():
        y, ref = Int8Linear(no_bias)(x), no_bias(x)
    assert float((y - ref).norm() / ref.norm()) < 0.02


def test_quantize_linear_layers_replaces_every_linear(tiny_dir: Path) -> None:
    model = AutoModel.from_pretrained(str(tiny_dir)).eval()
    plain = AutoModel.from_pretrained(str(tiny_dir)).eval()
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    n_layers = model.config.num_hidden_layers
    ids = torch.tensor([[0, 5, 6, 7, 2], [0, 8, 2, 1, 1]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
    stats = record_linear_input_absmax(model, [(ids, mask)])
    assert len(stats) == n_linear > 0
    assert not model.encoder.layer[0].attention.self.query._forward_hooks  # hooks removed
    assert quantize_linear_layers(model, stats) == n_linear
    assert quantize_linear_layers(plain, stats, fuse_qkv=False) == n_linear
    for m in (model, plain):
        assert not any(type(x) is torch.nn.Linear for x in m.modules())
    # Fused: one Int8Linear per attention block stands for query, key and value.
    assert sum(isinstance(x, Int8QKVSlice) for x in model.modules()) == 3 * n_layers
    assert sum(isinstance(x, Int8Linear) for x in model.modules()) == n_linear - 2 * n_layers
    assert sum(isinstance(x, Int8Linear) for x in plain.modules()) == n_linear
    with torch.no_grad():
        fused_out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        plain_out = plain(input_ids=ids, attention_mask=mask).last_hidden_state
    for out in (fused_out, plain_out):
        assert float(torch.nn.functional.cosine_similarity(out, ref, dim=-1).min()) > 0.99


def test_fused_qkv_slices() -> None:
    torch.manual_seed(0)
    attn = torch.nn.Module()
    attn.query, attn.key, attn.value = (torch.nn.Linear(16, 8) for _ in range(3))
    originals = (attn.query, attn.key, attn.value)
    quantize_linear_layers(attn)
    x1, x2 = torch.randn(3, 5, 16), torch.randn(3, 5, 16)
    with torch.no_grad():
        # Self-attention order, then a different input per slice (cross-attention), then repeats.
        for name, x in [
            ("query", x1),
            ("key", x1),
            ("value", x1),
            ("query", x1),
            ("key", x2),
            ("value", x2),
            ("value", x2),
            ("query", x2),
        ]:
            got = getattr(attn, name)(x)
            want = originals[("query", "key", "value").index(name)](x)
            assert got.shape == want.shape
            assert float((got - want).norm() / want.norm()) < 0.02
    assert isinstance(attn.qkv, Int8Linear) and attn.qkv.out_features == 24


def test_int8_path_on_tiny_model(tiny8: Encoder, tiny32: Encoder) -> None:
    assert tiny8.dtype == torch.int8
    assert "dtype='int8'" in repr(tiny8)
    assert isinstance(tiny8.model, RobertaModel)
    assert not any(type(m) is torch.nn.Linear for m in tiny8.model.modules())
    assert all(m.inv_smooth is not None for m in tiny8.model.modules() if isinstance(m, Int8Linear))
    v8 = tiny8.encode(TWEETS)
    assert v8.shape == (len(TWEETS), 32) and v8.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v8, axis=1), 1.0, atol=1e-5)
    assert cos(v8, tiny32.encode(TWEETS)).min() >= 0.99
    assert tiny8.encode([]).shape == (0, 32)


def test_int8_rows_independent_of_batching(tiny8: Encoder) -> None:
    batched = tiny8.encode(TWEETS)  # batch_size 3, padded batches
    single = np.stack([tiny8.encode([t])[0] for t in TWEETS])
    assert cos(batched, single).min() >= 0.999


def test_int8_load_is_deterministic(tiny_dir: Path, tiny8: Encoder) -> None:
    # Calibration runs on fixed texts in fixed batches: a second load quantises identically.
    again = Encoder(str(tiny_dir), dtype="int8", batch_size=5)
    for a, b in zip(tiny8.model.modules(), again.model.modules(), strict=True):
        if isinstance(a, Int8Linear):
            assert isinstance(b, Int8Linear)
            assert torch.equal(a.weight, b.weight)
            assert a.inv_smooth is not None and b.inv_smooth is not None
            assert torch.equal(a.inv_smooth, b.inv_smooth)
    np.testing.assert_array_equal(again.encode(TWEETS, batch_size=3), tiny8.encode(TWEETS))
    assert len(CALIBRATION_TEXTS) >= 16


def test_int8_is_cpu_only(tiny_dir: Path) -> None:
    with pytest.raises(ValueError, match="CPU only"):
        Encoder(str(tiny_dir), device="cuda", dtype="int8")


# -- MiniLM: real semantics ---------------------------------------------


def test_minilm_loads_without_tweet_normalization(minilm32: Encoder) -> None:
    assert minilm32.dim == 384
    assert minilm32.model_id == MINILM
    assert not minilm32.uses_tweet_normalization
    assert not isinstance(minilm32.tokenizer, BertweetTokenizer)


def test_minilm_bf16_agrees_with_fp32(minilm32: Encoder) -> None:
    bf16 = Encoder(MINILM, dtype="bfloat16")
    assert cos(bf16.encode(TWEETS), minilm32.encode(TWEETS)).min() >= 0.99


@pytest.mark.slow  # tens of seconds on 2 cores: runs in make test, not make check
def test_minilm_int8_agrees_with_fp32(minilm32: Encoder) -> None:
    # Real pretrained weights, real tweets: per-token activation scales and
    # SmoothQuant keep the int8 path close to fp32 (a per-tensor activation
    # scale, as in torch.ao dynamic quantisation, gave a mean of only ~0.97).
    int8 = Encoder(MINILM, dtype="int8")
    assert int8.dtype == torch.int8
    texts = feed_tweets(256) + TWEETS
    c = cos(int8.encode(texts), minilm32.encode(texts))
    assert c.mean() >= 0.995
    assert c.min() >= 0.99


def test_minilm_related_tweets_are_closer(minilm32: Encoder) -> None:
    v = minilm32.encode(
        [
            "A strong earthquake destroyed buildings in the city",
            "Powerful quake shakes the town, houses collapsed",
            "Floodwaters rise as heavy rain hits Queensland",
            "I baked a chocolate cake for my birthday party",
        ]
    )
    sim = v @ v.T
    assert sim[0, 1] > sim[0, 3] + 0.2
    assert sim[0, 1] > sim[0, 2] > sim[0, 3]
    assert sim[2, 0] > sim[2, 3]


# -- the token-budget path (the GPU path), run on CPU ----------------------------------
#
# workers.adapters.encoding.gpu_batching: the batcher and packer are pure functions; the packed
# forward runs the real transformers modules (no mocks) and must give what the padded
# path gives, to float rounding, in every layout.


def test_token_budget_batches_respect_the_budget_and_cover_every_item() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 129, size=500)
    for budget in (128, 300, 1000, 4096):
        for padded in (False, True):
            batches = token_budget_batches(lengths, budget, padded=padded)
            order = np.concatenate(batches)
            assert sorted(order.tolist()) == list(range(len(lengths)))  # a permutation
            assert np.all(np.diff(lengths[order]) <= 0)  # longest first
            for b in batches:
                cost = len(b) * lengths[b].max() if padded else lengths[b].sum()
                assert cost <= budget or len(b) == 1
            # Greedy: no batch could have taken the next item (the batches are full).
            for b, nxt in itertools.pairwise(batches):
                first_next = nxt[0]
                if padded:
                    assert (len(b) + 1) * lengths[b].max() > budget
                else:
                    assert lengths[b].sum() + lengths[first_next] > budget


def test_token_budget_batches_edge_cases() -> None:
    assert token_budget_batches([], 10) == []
    # Longer than the budget: alone. Ties keep input order (stable sort).
    batches = token_budget_batches([3, 50, 3, 3], 10)
    assert [b.tolist() for b in batches] == [[1], [0, 2, 3]]
    assert [b.tolist() for b in token_budget_batches([5, 5, 5], 10, padded=True)] == [[0, 1], [2]]
    with pytest.raises(ValueError):
        token_budget_batches([1, 2], 0)


def test_restore_order_undoes_the_sort() -> None:
    lengths = np.array([5, 1, 9, 3, 7, 2])
    batches = token_budget_batches(lengths, 10)
    results = [lengths[b].astype(np.float32)[:, None] for b in batches]  # "embedding" = length
    np.testing.assert_array_equal(restore_order(batches, results, len(lengths))[:, 0], lengths)


def test_pack_rows_fills_rows_without_overflow() -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(2, 60, size=400)
    rows = pack_rows(lengths, 128)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(lengths[r].sum() <= 128 for r in rows)
    assert lengths.sum() / (128 * len(rows)) > 0.95  # best fit leaves little padding
    assert pack_rows([], 8) == []
    with pytest.raises(ValueError):
        pack_rows([9], 8)


def test_batches_from_windows_stream_in_and_carry_over() -> None:
    rng = np.random.default_rng(2)
    lengths = rng.integers(2, 40, size=300)
    ids = [list(range(100, 100 + int(n))) for n in lengths]
    windows = [Window.from_lists(ids[a:b], np.arange(a, b)) for a, b in chunked(len(ids), 37)]
    for layout in ("varlen", "padded", "rows"):
        got = list(batches_from_windows(windows, 200, layout=layout, window_tokens=800, width=64))
        seen = np.concatenate([w.index for w in got])
        assert sorted(seen.tolist()) == list(range(len(ids)))
        for w in got:
            if layout == "varlen":
                assert w.tokens <= 200
            elif layout == "padded":
                assert len(w) * w.lengths.max() <= 200
            # the ids travel with their tweet
            for i, start, n in zip(w.index, w.offsets()[:-1], w.lengths, strict=True):
                assert w.ids[start : start + n].tolist() == ids[i]
        if layout == "varlen":  # carried over: every batch but the last is nearly full
            assert all(w.tokens > 200 - 40 for w in got[:-1])


def test_build_batch_layouts() -> None:
    ids = [[0, 7, 8, 2], [0, 9, 2], [0, 5, 6, 7, 8, 2]]
    w = Window.from_lists(ids, np.array([10, 11, 12]))
    flat = [t for r in ids for t in r]
    v = build_batch(w, "varlen", pad_id=1, position_offset=2)
    assert v.input_ids.tolist() == flat
    assert v.position_ids is not None and v.position_ids.tolist() == [2, 3, 4, 5, 2, 3, 4, 2, 3, 4, 5, 6, 7]
    assert v.cu_seqlens.tolist() == [0, 4, 7, 13] and v.cu_seqlens.dtype == torch.int32
    assert v.segment.tolist() == [0] * 4 + [1] * 3 + [2] * 6
    assert v.max_len == 6 and v.n_tokens == 13 and v.index.tolist() == [10, 11, 12]
    p = build_batch(w, "padded", pad_id=1, position_offset=2)
    assert p.input_ids.shape == (3, 6) and p.mask is not None and int(p.mask.sum()) == 13
    assert p.tokens is not None
    assert p.input_ids.reshape(-1)[p.tokens].tolist() == flat  # the real tokens, in batch order
    r = build_batch(w, "rows", pad_id=1, position_offset=2, width=8)
    assert r.input_ids.shape == (2, 8)  # 6 | 4 + 3 (best fit)
    assert r.tokens is not None and r.input_ids.reshape(-1)[r.tokens].tolist() == flat
    assert r.position_ids is not None and r.row_segment is not None
    assert r.position_ids.reshape(-1)[r.tokens].tolist() == v.position_ids.tolist()
    assert r.row_segment.reshape(-1)[r.tokens].tolist() == v.segment.tolist()
    assert int((r.row_segment == -1).sum()) == 2 * 8 - 13
    with pytest.raises(ValueError):
        build_batch(w, "bogus", pad_id=1, position_offset=2)  # type: ignore[arg-type]


def test_prefetch_hands_over_items_and_errors() -> None:
    with prefetch(iter(range(100)), depth=2) as items:
        assert list(items) == list(range(100))

    def failing() -> Any:
        yield 1
        raise RuntimeError("tokenizer broke")

    with pytest.raises(RuntimeError, match="tokenizer broke"), prefetch(failing()) as items:
        list(items)
    # The consumer stopping early stops the producer (no thread left behind).
    with prefetch(iter(range(10**9)), depth=2) as items:
        assert next(items) == 0


def test_cpu_default_is_the_fixed_count_path(tiny32: Encoder) -> None:
    assert tiny32.token_budget is None and tiny32.packing == "fixed"
    assert tiny32.tokenize_workers == 0
    assert "token_budget" not in repr(tiny32)


# The varlen packings take ~40 s each on 2 cores: make test runs them, make check the others.
PACKINGS_ON_CPU = [
    pytest.param("varlen", "padded", marks=pytest.mark.slow),
    pytest.param("varlen", "nested", marks=pytest.mark.slow),
    ("rows", "auto"),
    ("padded", "auto"),
]


@pytest.fixture(scope="module")
def budget_texts() -> list[str]:
    return feed_tweets(200) + TWEETS + ["flood help " * 100]  # mixed lengths, "", one truncated


@pytest.mark.parametrize(("packing", "attention"), PACKINGS_ON_CPU)
def test_token_budget_path_matches_the_padded_path(
    tiny_dir: Path, tiny32: Encoder, budget_texts: list[str], packing: str, attention: str
) -> None:
    # fp32 on CPU: the same maths as the padded path, to float rounding (a small budget
    # makes many batches, so the order restoration is exercised too).
    with warnings.catch_warnings():  # the nested-tensor math kernel (CPU) warns it is a prototype
        warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")
        enc = Encoder(str(tiny_dir), dtype="float32", token_budget=300, packing=packing, attention=attention)
        got = enc.encode(budget_texts)
    assert enc.token_budget == 300
    assert enc.packing == (f"varlen/{attention}" if packing == "varlen" else packing)
    assert f"packing={enc.packing!r}" in repr(enc)
    want = tiny32.encode(budget_texts)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=2e-6)
    assert cos(got, want).min() >= 0.999999


@pytest.mark.slow  # tens of seconds on 2 cores: runs in make test, not make check
def test_token_budget_path_on_bert(minilm32: Encoder, budget_texts: list[str]) -> None:
    # BERT (MiniLM): position ids from 0, WordPiece, pretrained weights; CLS pooling too.
    enc = Encoder(MINILM, dtype="float32", token_budget=512)
    assert enc.packing == "varlen/padded"
    np.testing.assert_allclose(enc.encode(budget_texts), minilm32.encode(budget_texts), atol=5e-6)
    cls_ref = Encoder(MINILM, dtype="float32", pooling="cls")
    cls_budget = Encoder(MINILM, dtype="float32", pooling="cls", token_budget=512, packing="rows")
    np.testing.assert_allclose(cls_budget.encode(TWEETS), cls_ref.encode(TWEETS), atol=5e-6)


@pytest.mark.slow  # tens of seconds on 2 cores: runs in make test, not make check
def test_token_budget_path_bf16_agrees_with_fp32_padded(
    tiny_dir: Path, tiny32: Encoder, minilm32: Encoder, budget_texts: list[str]
) -> None:
    # What CUDA runs (bf16 weights and compute, float32 pooling) against fp32 padded.
    enc = Encoder(str(tiny_dir), dtype="bfloat16", token_budget=1024)
    assert cos(enc.encode(budget_texts), tiny32.encode(budget_texts)).min() >= 0.999
    mini = Encoder(MINILM, dtype="bfloat16", token_budget=1024)
    assert cos(mini.encode(budget_texts), minilm32.encode(budget_texts)).min() >= 0.999


def test_varlen_computes_nothing_for_padding(tiny_dir: Path, budget_texts: list[str]) -> None:
    enc = Encoder(str(tiny_dir), dtype="float32", token_budget=100_000, packing="varlen")
    rows: list[int] = []
    model: Any = enc.model
    hook = model.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda _m, inputs, _o: rows.append(inputs[0].reshape(-1, inputs[0].shape[-1]).shape[0])
    )
    try:
        enc.encode(budget_texts)
    finally:
        hook.remove()
    assert rows == [sum(len(x) for x in enc.tokenize(budget_texts))]  # one batch, real tokens only


def test_token_budget_path_order_progress_and_empty(tiny_dir: Path) -> None:
    enc = Encoder(str(tiny_dir), dtype="float32", token_budget=128)  # ~ a few tweets per batch
    calls: list[tuple[int, int]] = []
    batched = enc.encode(TWEETS, progress=lambda done, n: calls.append((done, n)))
    single = np.stack([enc.encode([t])[0] for t in TWEETS])
    np.testing.assert_allclose(batched, single, atol=1e-6)
    assert calls[-1] == (len(TWEETS), len(TWEETS)) and len(calls) >= 2
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert enc.encode([]).shape == (0, 32)
    with pytest.raises(TypeError):
        enc.encode("one string")


def test_packing_falls_back_when_a_layout_cannot_run(
    tiny_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Flash varlen needs CUDA: asked for on CPU, the load-time check moves on to "rows".
    with caplog.at_level("WARNING", logger="workers.adapters.encoding.encoder"):
        enc = Encoder(str(tiny_dir), dtype="float32", token_budget=512, attention="flash")
    assert enc.packing == "rows"
    assert "varlen/flash" in caplog.text
    with pytest.raises(ValueError, match="no packing"):
        Encoder(str(tiny_dir), dtype="float32", token_budget=512, packing="varlen", attention="flash")
    # Not a standard encoder layout: varlen is not tried at all.
    odd = Encoder(str(tiny_dir), dtype="float32")
    odd_model: Any = odd.model
    odd_model.config.position_embedding_type = "relative_key"
    assert odd._candidates("auto", "auto") == [("rows", "padded"), ("padded", "padded")]
    with pytest.raises(ValueError):
        Encoder(str(tiny_dir), token_budget=-1)
    with pytest.raises(ValueError):
        Encoder(str(tiny_dir), token_budget=64, packing="bogus")


def test_token_budget_below_max_length_is_raised_to_it(tiny_dir: Path) -> None:
    assert Encoder(str(tiny_dir), dtype="float32", token_budget=10).token_budget == 128


@pytest.mark.slow
def test_tokenizing_processes_give_the_same_embeddings(tiny_dir: Path, tiny32: Encoder) -> None:
    texts = feed_tweets(600) + TWEETS
    enc = Encoder(str(tiny_dir), dtype="float32", token_budget=2048, tokenize_workers=1)
    try:
        assert enc.tokenize_workers == 1
        np.testing.assert_allclose(enc.encode(texts), tiny32.encode(texts), atol=2e-6)
    finally:
        enc.close()


@pytest.mark.slow  # tens of seconds on 2 cores: runs in make test, not make check
def test_host_batches_and_forward_batch_are_encode_in_two_halves(
    tiny_dir: Path, budget_texts: list[str]
) -> None:
    # bench_gpu times the two halves apart: together they must be exactly what encode gives.
    enc = Encoder(str(tiny_dir), dtype="float32", token_budget=300)
    want = enc.encode(budget_texts)
    got = np.zeros_like(want)
    batches = list(enc.host_batches(budget_texts))
    assert len(batches) > 1
    for batch in batches:
        got[batch.index] = enc.forward_batch(batch).numpy()
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="token-budget path"):
        Encoder(str(tiny_dir), dtype="float32").host_batches(TWEETS)


def test_tiny_model_keeps_its_fastbpe_files(tiny_dir: Path) -> None:
    # transformers 5's save_vocabulary rewrites bpe.codes without fastBPE's counts, and its
    # loader then drops each merge's second half; the files must stay as written.
    lines = (tiny_dir / "bpe.codes").read_text(encoding="utf-8").splitlines()
    assert lines and all(len(line.split()) == 3 for line in lines)
    ranks = Encoder(str(tiny_dir), dtype="float32").tokenizer.bpe_ranks
    assert all(len(pair) == 2 for pair in ranks)
