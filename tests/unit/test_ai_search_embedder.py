"""AI Search's embedders (runtime/ai/search/embedder.py): unit rows, deterministic, the trained model
finds a paraphrase's passage that shares no word with it, the recipe featurizes as the runtime
does, and default_embedder serves the trained model only while it beats the stand-in."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from bench.ai_search_corpus import chunk_texts, content_words, documents, heldout, normalize_space
from runtime.ai.search import embedder as emb

TEXTS = [
    "The Brawick pottery guild on the coast was founded in 1843.",
    "When was the ceramics society along the shoreline established?",
    "Ünïcode TEXT, with  punctuation!! and numbers 12 345",
    "a",
]

# written for this test, in sentence frames the corpus generator never uses: each question names the
# concepts of its passage with other words (no content word in common, checked below)
PARAPHRASES = [
    (
        "Where does the pottery guild near the lighthouse on the coast gather?",
        "Our ceramics society meets every week in a hall beside the old beacon by the seaside.",
    ),
    (
        "Which beer makers fly red pennants over the harbour?",
        "Ale brewers hang crimson flags along the quay each spring.",
    ),
    (
        "Who teaches clockmaking at the academy below the volcano?",
        "Lessons in horology are given at the college inside the caldera by Master Oswin.",
    ),
    (
        "Is there a glassblowing studio in the woods with a stag on its badge?",
        "A lampwork atelier in the forest shows a deer on its crest.",
    ),
    (
        "Where can tourists see the bookbinding museum by the canal?",
        "Visitors will find the printing gallery next to the waterway, open daily.",
    ),
    (
        "What does the honey cooperative on the island sell at its fair?",
        "At its carnival the apiculture collective on the atoll offers jars and candles.",
    ),
]


@pytest.fixture(scope="module")
def trained() -> emb.TrainedEmbedder:
    folder = emb.model_folder()
    if not (folder / "model.safetensors").is_file():
        pytest.fail(f"{folder}: the trained embedder is not shipped")
    return emb.trained_embedder(folder)


@pytest.mark.parametrize("which", ["stand_in", "trained"])
def test_rows_are_unit_length_float32_and_deterministic(which, trained):
    model = emb.HashedNgrams() if which == "stand_in" else trained
    vectors = model.embed(TEXTS)
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), model.dimensions)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(vectors, model.embed(TEXTS))
    assert np.array_equal(
        vectors[1], model.embed([TEXTS[1]])[0]
    )  # a text's vector never depends on its batch
    assert model.embed([]).shape == (0, model.dimensions)


def test_a_fresh_load_gives_the_same_vectors(trained):
    again = emb.TrainedEmbedder(emb.model_folder())
    assert again.name == emb.TRAINED_NAME == trained.name
    assert np.array_equal(again.embed(TEXTS), trained.embed(TEXTS))


def test_the_trained_model_ranks_a_paraphrases_passage_above_random_passages(trained):
    for question, passage in PARAPHRASES:
        assert not content_words(question) & content_words(passage), question
    fresh = documents(30, seed=424_242, heldout=True)  # a seed neither the benchmark nor training uses
    rng = np.random.default_rng(0)
    others = list(rng.choice([s.text for d in fresh for s in d.sentences], 150, replace=False))
    passages = [p for _, p in PARAPHRASES] + others

    def ranks(model) -> list[int]:
        scores = model.embed([q for q, _ in PARAPHRASES]) @ model.embed(passages).T
        return [int((scores[i] > scores[i, i]).sum()) for i in range(len(PARAPHRASES))]

    assert ranks(trained) == [0] * len(PARAPHRASES)
    # the lexical stand-in cannot (so the check is not one that any embedder passes)
    assert sum(r == 0 for r in ranks(emb.HashedNgrams())) <= 1


def test_the_trained_model_beats_the_stand_in_on_held_out_paraphrases(trained):
    corpus = heldout(60)
    chunks = [(d.key, f"{c}\n{t}", t) for d in corpus.documents for c, t in chunk_texts(d, 256, 10)]
    asked = [q for q in corpus.questions if q.subset == "paraphrased"]

    def recall_at_5(model) -> float:
        scores = model.embed([q.text for q in asked]) @ model.embed([c for _, c, _ in chunks]).T
        top = np.argsort(-scores, axis=1)[:, :5]
        return np.mean(
            [
                any(
                    chunks[j][0] == q.key and normalize_space(q.passage) in normalize_space(chunks[j][2])
                    for j in row
                )
                for q, row in zip(asked, top, strict=True)
            ]
        )

    assert recall_at_5(trained) >= 0.9 > 0.1 >= recall_at_5(emb.HashedNgrams())


def test_the_recipe_featurizes_as_the_runtime_does(trained):
    from models.recipe import train_embedder as recipe

    config = json.loads((emb.model_folder() / "config.json").read_text())
    ours, theirs = emb.Featurizer(config["features"]), recipe.Featurizer(config["features"])
    assert {k: v for k, v in recipe.FEATURES.items() if k != "buckets"}.items() <= config["features"].items()
    for text in [*TEXTS, *(p for pair in PARAPHRASES for p in pair)]:
        a, b = ours.features(text), theirs.features(text)
        for x, y in zip(a, b, strict=True):
            assert np.array_equal(np.asarray(x), np.asarray(y))
        assert np.array_equal(
            emb.lexical_vector(a.lexical_ids, a.lexical_weights, 512, trained.idf),
            recipe.lexical_vector(b.lexical_ids, b.lexical_weights, 512, trained.idf),
        )
    for share in (0.0, 0.3, 0.5, 0.8, 1.0):
        assert emb.channel_scales(share, 0.3, trained.shares) == recipe.channel_scales(
            share, 0.3, trained.shares
        )


def test_a_text_of_unknown_words_is_read_lexically(trained):
    f = trained.featurizer.features("Kubernetes operators reconcile custom resources")
    assert f.known_share < trained.shares[0]
    assert emb.channel_scales(f.known_share, trained.weight, trained.shares) == (0.0, 1.0)
    vector = trained.embed(["Kubernetes operators reconcile custom resources"])[0]
    assert not vector[: trained.learned].any()


def test_default_embedder_follows_the_recorded_comparison(tmp_path, monkeypatch):
    shipped = emb.model_folder()
    record = json.loads((shipped / "heldout.json").read_text())
    para = record["paraphrased"]
    expected = (
        emb.TRAINED_NAME if para["trained"]["recall@5"] > para["stand_in"]["recall@5"] else emb.HASHED_NGRAMS
    )
    assert emb.default_embedder().name == expected == emb.TRAINED_NAME

    folder = tmp_path / emb.MODEL_FOLDER
    shutil.copytree(shipped, folder)
    monkeypatch.setattr(emb, "INSTALLED_MODELS_DIR", tmp_path)
    assert emb.default_embedder().name == emb.TRAINED_NAME
    worse = dict(record, paraphrased={"trained": {"recall@5": 0.1}, "stand_in": {"recall@5": 0.2}})
    (folder / "heldout.json").write_text(json.dumps(worse))
    assert isinstance(emb.default_embedder(), emb.HashedNgrams)
    (folder / "heldout.json").unlink()  # never measured: the stand-in
    assert isinstance(emb.default_embedder(), emb.HashedNgrams)
    shutil.rmtree(folder)  # nothing shipped: the stand-in
    assert isinstance(emb.default_embedder(), emb.HashedNgrams)
