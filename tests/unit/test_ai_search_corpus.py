"""The AI Search benchmark's generated corpus (bench/ai_search_corpus.py): deterministic, sized as
the issue asks, paraphrased questions that share no content word with their answer, and a training
split that never holds a held-out document."""

from __future__ import annotations

import functools

from bench.ai_search_corpus import (
    FACTS,
    Corpus,
    check_lexicon,
    chunk_texts,
    content_words,
    heldout,
    normalize_space,
    stem,
    training,
    unique_profiles,
)


@functools.cache
def _heldout() -> Corpus:
    return heldout()


def test_the_lexicon_keeps_its_promises():
    assert check_lexicon() == []


def test_content_words_fold_case_drop_stop_words_and_stem():
    assert content_words("The Founders of THE guilds") == {"found", "guild"}
    assert stem("founded") == stem("founder") == stem("founding") == "found"
    assert content_words("When was it in the") == set()


def test_the_corpus_is_deterministic():
    again = heldout()
    first = _heldout()
    assert [d.markdown for d in again.documents] == [d.markdown for d in first.documents]
    assert [(q.text, q.key, q.passage) for q in again.questions] == [
        (q.text, q.key, q.passage) for q in first.questions
    ]


def test_sizes_and_subsets():
    corpus = _heldout()
    assert len(corpus.documents) >= 300
    assert len({d.key for d in corpus.documents}) == len(corpus.documents)
    sizes = [len(d.markdown.encode()) for d in corpus.documents]
    assert 1700 <= sum(sizes) / len(sizes) <= 2300
    for doc in corpus.documents:
        assert doc.markdown.startswith(f"# {doc.title}\n")
        assert doc.markdown.count("\n## ") >= 3
    para = [q for q in corpus.questions if q.subset == "paraphrased"]
    assert len(para) * 3 >= len(corpus.questions)


def test_paraphrased_questions_share_no_content_word_with_their_answer():
    corpus = _heldout()
    by_key = corpus.by_key()
    for q in corpus.questions:
        doc = by_key[q.key]
        assert q.passage in doc.markdown
        shared = content_words(q.text) & content_words(q.passage)
        if q.subset == "paraphrased":
            assert not shared, (q.text, q.passage, shared)
            # nor with the rest of its document, and never its name
            assert not content_words(q.text) & content_words(doc.markdown), q.text
            assert doc.name.casefold() not in q.text.casefold()
        else:
            assert len(shared) >= 2, (q.text, q.passage)


def test_a_paraphrased_question_names_one_document_only():
    corpus = _heldout()
    by_key = corpus.by_key()
    for q in corpus.questions:
        if q.subset != "paraphrased":
            continue
        doc = by_key[q.key]
        sentence = next(s for s in doc.sentences if s.text == q.passage)
        assert unique_profiles(corpus.documents, doc, sentence.attributes)
        assert q.fact == sentence.fact and q.fact in FACTS


def test_every_answer_lies_whole_in_one_chunk_at_the_pinned_chunking():
    corpus = _heldout()
    by_key = corpus.by_key()
    for q in corpus.questions[:120]:
        chunks = chunk_texts(by_key[q.key], 256, 10)
        assert any(normalize_space(q.passage) in normalize_space(text) for _, text in chunks), q.passage


def test_the_training_split_holds_no_held_out_document():
    held = _heldout()
    train = training(150)
    assert {d.name for d in train.documents}.isdisjoint({d.name for d in held.documents})
    assert {d.key for d in train.documents}.isdisjoint({d.key for d in held.documents})
    passages = {q.passage for q in held.questions}
    assert not passages & {s.text for d in train.documents for s in d.sentences}
    assert not {q.text for q in held.questions} & {q.text for q in train.questions}
    assert {q.subset for q in train.questions} == {"shared", "paraphrased"}
