"""A generated corpus for measuring AI Search's retrieval: Markdown documents, each about one made-up
organisation, and questions whose answer is one sentence of one document.

    python -m bench.ai_search_corpus --stats                  # sizes, subsets, checks
    python -m bench.ai_search_corpus --write-heldout DIR      # the held-out documents + questions.jsonl
    python -m bench.ai_search_corpus --write-train PATH       # the training pairs (JSON lines)

Each document describes an organisation (a guild, a school, a museum, ...) by a profile: its kind, its
setting, its craft, a landmark near it, the device on its emblem and the colour of its banners. Every
such concept has several surface words in LEXICON (pottery, ceramics, earthenware, stoneware,
porcelain), and a document uses ONE surface per concept throughout, chosen at random. Each of its
eighteen fact sentences (when it was founded, how many members it counts, who runs it, ...) names the
organisation's kind and three of its attributes, and states one fact.

Two kinds of question ask for a fact sentence:

- "shared": asked with the document's own words (its name, its kind, the fact's word), as a reader who
  has seen the document would: "When was the Varnholt guild founded?";
- "paraphrased": asked with OTHER surfaces of the same concepts, without the name: "When was the
  ceramics society along the shoreline beside the beacon established?". Such a question shares no
  content word with its answer sentence, nor with the rest of its document (`content_words`: case
  folded, stop words dropped, lightly stemmed; checked for every question here and in
  tests/unit/test_ai_search_corpus.py), so neither a keyword index nor a lexical embedding can find
  it; a model that knows the surfaces are synonyms can, since the kind and three attributes
  together name one document only (checked: `unique_profiles`).

The held-out set (HELDOUT_SEED, names from one part of the name space) is what the benchmark
measures; the training set (TRAIN_SEED, names from the other part, never the same document) is
what the embedder is trained on. Both draw from the same LEXICON and the same sentence templates:
the held-out questions are new documents and new combinations, not new words or new phrasings.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

HELDOUT_SEED, TRAIN_SEED = 58_001, 58_777
HELDOUT_DOCS, TRAIN_DOCS = 300, 2000
HELDOUT_NAME_SHARE = 35  # percent of the coined names (by a stable hash) kept for held-out documents

# a common English stop list (NLTK's, plus the prepositions and quantifiers the templates use)
STOP_WORDS = frozenset(
    """a about above across after again against all almost along also am amid among an and any are
    around as at be because been before being below beneath beside besides between beyond both but by
    can could did do does doing down during each either every few for from further had has have
    having he her here hers herself him himself his how i if in inside into is it its itself just me
    more most much many my myself near next no nor not now of off on once only onto or other our ours
    ourselves out over own same she should so some such than that the their theirs them themselves
    then there these they this those through to too toward towards under until up upon very via was
    we were what when where which while who whom whose why will with within without would you your
    yours yourself yourselves""".split()
)
_WORD = re.compile(r"\w+", re.UNICODE)


def stem(word: str) -> str:
    """A light stemmer: plural, -ed/-ing, one derivational suffix, a final e (founders, founder,
    founded and found all become "found"). It conflates more than it should rather than less, which
    makes the paraphrase check stricter."""
    w = word.casefold()
    if w.endswith("sses"):
        w = w[:-2]
    elif w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("s") and not w.endswith("ss") and len(w) > 3:
        w = w[:-1]
    for suffix in ("ing", "ed"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)]
            break
    for suffix in ("ation", "ment", "ness", "ly", "er"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)]
            break
    if w.endswith("e") and len(w) > 3:
        w = w[:-1]
    return w


def content_words(text: str) -> set[str]:
    """The stems of `text`'s words that are not stop words (case folded)."""
    return {stem(w) for w in _WORD.findall(text.casefold()) if w not in STOP_WORDS}


# concept -> its surfaces; a document uses one, a paraphrase another
KINDS = {
    "guild": ["guild", "society", "association", "fellowship", "league"],
    "school": ["school", "academy", "college", "institute", "conservatory"],
    "museum": ["museum", "gallery", "showroom", "pavilion", "repository"],
    "workshop": ["workshop", "studio", "atelier", "manufactory"],
    "cooperative": ["cooperative", "collective", "union", "syndicate", "consortium"],
    "club": ["club", "circle", "fraternity", "brotherhood", "clan"],
    "troupe": ["troupe", "company", "ensemble", "corps"],
    "market": ["market", "bazaar", "emporium", "souk"],
    "farm": ["farm", "ranch", "homestead", "croft", "smallholding"],
    "abbey": ["abbey", "priory", "monastery", "cloister", "friary"],
}
SETTINGS = {  # whole phrases: the preposition is a stop word, the noun is the surface
    "coast": [
        "on the coast",
        "by the seaside",
        "along the shoreline",
        "at the oceanfront",
        "beside the surf",
    ],
    "mountains": [
        "in the mountains",
        "among the peaks",
        "in the highlands",
        "amid the summits",
        "below the crags",
    ],
    "desert": ["in the desert", "among the dunes", "in the sands", "across the barrens"],
    "forest": ["in the forest", "in the woods", "by the thicket", "inside the grove", "beside the copse"],
    "river": ["on the river", "by the stream", "along the brook", "beside the creek", "near the rapids"],
    "island": ["on the island", "on the atoll", "in the archipelago", "on the skerry"],
    "marsh": ["in the marsh", "in the swamp", "by the bog", "on the fen", "beside the mire"],
    "valley": ["in the valley", "in the dale", "in the glen", "in the vale", "in the hollow"],
    "prairie": ["on the prairie", "on the grassland", "in the meadows", "on the steppe", "across the plains"],
    "lake": ["on the lake", "by the loch", "beside the mere", "near the tarn", "along the lagoon"],
    "volcano": ["below the volcano", "by the crater", "inside the caldera", "among the fumaroles"],
    "tundra": [
        "on the tundra",
        "by the glacier",
        "on the permafrost",
        "across the icefield",
        "among the floes",
    ],
}
CRAFTS = {
    "pottery": ["pottery", "ceramics", "earthenware", "stoneware", "porcelain"],
    "weaving": ["weaving", "textiles", "tapestry", "looms", "fabrics"],
    "glass": ["glassblowing", "crystal", "lampwork", "glassware"],
    "brewing": ["brewing", "ale", "beer", "malting", "hops"],
    "carpentry": ["carpentry", "joinery", "cabinetry", "furniture"],
    "smithing": ["blacksmithing", "ironwork", "forging", "anvils", "farriery"],
    "cheese": ["cheesemaking", "dairy", "curds", "creamery"],
    "bees": ["beekeeping", "apiculture", "honey", "hives"],
    "books": ["bookbinding", "printing", "typesetting", "calligraphy"],
    "boats": ["shipbuilding", "hulls", "keels", "rigging"],
    "wine": ["winemaking", "vineyards", "viticulture", "grapes"],
    "bread": ["baking", "bread", "loaves", "pastry"],
    "leather": ["leatherwork", "tanning", "hides", "saddlery"],
    "clocks": ["clockmaking", "horology", "timepieces", "chronometers"],
}
LANDMARKS = {
    "lighthouse": ["lighthouse", "beacon", "pharos", "lantern"],
    "bridge": ["bridge", "viaduct", "span", "crossing"],
    "tower": ["tower", "turret", "spire", "belfry", "steeple"],
    "castle": ["castle", "fortress", "citadel", "stronghold", "bastion"],
    "observatory": ["observatory", "telescope", "planetarium"],
    "amphitheatre": ["amphitheatre", "arena", "coliseum", "stadium"],
    "canal": ["canal", "waterway", "aqueduct", "channel"],
    "harbour": ["harbour", "quay", "wharf", "pier", "docks"],
    "cathedral": ["cathedral", "basilica", "minster", "church"],
    "cemetery": ["cemetery", "graveyard", "necropolis", "tombs"],
    "garden": ["garden", "arboretum", "orangery", "nursery"],
    "station": ["station", "depot", "terminus", "railhead"],
    "plaza": ["plaza", "square", "piazza", "forum"],
}
DEVICES = {  # what its emblem shows
    "crown": ["crown", "diadem", "coronet", "tiara"],
    "sword": ["sword", "blade", "sabre", "rapier"],
    "horse": ["horse", "stallion", "steed", "mare"],
    "serpent": ["serpent", "snake", "viper", "adder"],
    "hound": ["hound", "dog", "canine", "mastiff"],
    "stag": ["stag", "deer", "hart", "elk"],
    "flower": ["flower", "blossom", "bloom", "posy"],
    "hammer": ["hammer", "mallet", "gavel", "sledge"],
    "shield": ["shield", "buckler", "escutcheon"],
    "chalice": ["chalice", "cup", "grail", "tankard"],
}
COLOURS = {
    "red": ["red", "crimson", "scarlet", "vermilion", "ruby"],
    "blue": ["blue", "azure", "cobalt", "sapphire", "navy"],
    "green": ["green", "emerald", "jade", "verdant", "olive"],
    "yellow": ["yellow", "golden", "amber", "saffron", "lemon"],
    "purple": ["purple", "violet", "lilac", "mauve", "plum"],
    "white": ["white", "ivory", "snowy", "alabaster", "pearl"],
    "black": ["black", "ebony", "jet", "onyx", "sable"],
    "orange": ["orange", "tangerine", "apricot", "rust"],
    "grey": ["grey", "silver", "ashen", "slate", "pewter"],
    "brown": ["brown", "umber", "chestnut", "tawny", "russet"],
}
# the words that carry an attribute or a fact, each a concept of its own
SLOTS = {
    "emblem": ["emblem", "crest", "insignia", "badge", "sigil"],
    "banners": ["banners", "flags", "pennants", "ensigns", "standards"],
    "town": ["town", "city", "municipality", "borough", "metropolis"],
}
CATEGORIES = {
    "kind": KINDS,
    "setting": SETTINGS,
    "craft": CRAFTS,
    "landmark": LANDMARKS,
    "device": DEVICES,
    "colour": COLOURS,
}
ATTRIBUTES = ("setting", "craft", "landmark", "device", "colour")  # a fact sentence names three

WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
MONTHS = "January February March April May June July August September October November December".split()

# fact -> (its concept's surfaces, the sentence, the question (shared and paraphrased alike), the value)
# {S}: the subject with its attributes ("the Varnholt pottery guild on the coast near the lighthouse");
# {v}: the fact's surface; {x}: the value. A question's {D} is the subject as the question names it.
FACTS: dict[str, tuple[list[str], str, str]] = {
    "founded": (
        ["founded", "established", "inaugurated", "chartered", "incorporated"],
        "{S} was {v} in {x}.",
        "When was {D} {v}?",
    ),
    "members": (
        ["members", "affiliates", "adherents", "enrollees"],
        "{S} counts {x} {v}.",
        "How many {v} does {D} have?",
    ),
    "visitors": (
        ["visitors", "tourists", "guests", "sightseers", "travellers"],
        "{S} receives about {x} {v} annually.",
        "How many {v} come to {D}?",
    ),
    "originator": (
        ["originator", "creator", "initiator", "pioneer"],
        "The {v} of {S} was {x}.",
        "Who was the {v} of {D}?",
    ),
    "leader": (
        ["director", "chairperson", "steward", "president", "superintendent"],
        "Today {S} is run by {x}, its {v}.",
        "Who is the {v} of {D}?",
    ),
    "distance": (
        SLOTS["town"],
        "{S} lies {x} kilometres from the nearest {v}.",
        "How far is {D} from the closest {v}?",
    ),
    "festival": (
        ["festival", "fair", "carnival", "gala", "jubilee"],
        "Every {x} {S} holds a {v}.",
        "In which month does {D} host its {v}?",
    ),
    "fee": (
        ["fee", "charge", "price", "toll", "tariff"],
        "The {v} for a day at {S} is {x} florins.",
        "What is the {v} at {D}?",
    ),
    "grounds": (
        ["grounds", "premises", "estate", "site", "campus"],
        "The {v} of {S} cover {x} hectares.",
        "How big are the {v} of {D}?",
    ),
    "output": (
        ["pieces", "items", "wares", "goods", "articles"],
        "{S} turns out {x} {v} every season.",
        "How many {v} does {D} make?",
    ),
    "staff": (
        ["workers", "employees", "labourers", "hands"],
        "{S} employs {x} {v}.",
        "How many {v} does {D} hire?",
    ),
    "apprentices": (
        ["apprentices", "trainees", "pupils", "novices"],
        "{S} trains {x} {v} at a time.",
        "How many {v} does {D} teach?",
    ),
    "closed": (
        ["closed", "shut", "shuttered", "locked"],
        "{S} is {v} on {x}.",
        "On which weekday is {D} {v}?",
    ),
    "archive": (
        ["documents", "papers", "records", "files", "letters"],
        "{S} keeps an archive of {x} {v}.",
        "How many {v} are stored by {D}?",
    ),
    "elevation": (
        ["elevation", "altitude", "height"],
        "The {v} of {S} is {x} metres.",
        "What is the {v} of {D}?",
    ),
    "capacity": (
        ["spectators", "onlookers", "audience", "viewers"],
        "The hall of {S} seats {x} {v}.",
        "How many {v} fit inside {D}?",
    ),
    "relic": (
        ["relic", "artefact", "heirloom", "antique"],
        "The oldest {v} kept by {S} dates from {x}.",
        "How ancient is the earliest {v} of {D}?",
    ),
    "award": (
        ["award", "prize", "medal", "trophy", "honour"],
        "{S} won the {v} in {x}.",
        "When did {D} earn its {v}?",
    ),
}
INTRO = "{S} is {a} {k} known for its {c}."
SECTIONS = ("Overview", "Origins", "People", "Access")
LANDMARK_PREPS = ("near", "beside", "by", "next to")

FIRST_NAMES = (
    "Ada Bram Cora Dario Edda Falk Greta Hugo Ines Jonas Kira Lars Mila Nils Orla Pavel Rhea Sven "
    "Tilde Ugo Vera Wim Yara Zeno Anouk Birte Cosmo Dagny Elif Fiete Gunnar Halla Ivo Jorun Kasimir"
).split()
_ONSETS = (
    "bra cor dun el fen gal har is jor kel lun mor nor os pel quin ros sal tor ul vel wen yar zan "
    "ab bel cal dor ev fal gor hal ir kal lor mal nes or pra rav sel tam und vor"
).split()
_MIDS = ("", "n", "r", "l", "s", "th", "m")
_ENDS = (
    "holt wick ford stead by thorpe ley ham worth combe ridge more gate field brook hurst well bury "
    "ton wyn stow den shaw acre"
).split()


def _lexicon_words() -> dict[str, str]:
    """stem -> the concept it belongs to, over every surface of every concept."""
    owner: dict[str, str] = {}
    groups = [(f"{cat}:{c}", s) for cat, table in CATEGORIES.items() for c, s in table.items()]
    groups += [(f"slot:{c}", s) for c, s in SLOTS.items() if c != "town"]
    groups += [(f"fact:{f}", spec[0]) for f, spec in FACTS.items()]
    for concept, surfaces in groups:
        for surface in surfaces:
            for w in content_words(surface):
                owner.setdefault(w, concept)
    return owner


def check_lexicon() -> list[str]:
    """The lexicon's promises, as a list of what breaks them (empty when sound): no content word is
    shared by two surfaces of a concept nor by two concepts, and no template word is a surface's."""
    problems: list[str] = []
    owner: dict[str, str] = {}
    groups = [(f"{cat}:{c}", s) for cat, table in CATEGORIES.items() for c, s in table.items()]
    groups += [(f"slot:{c}", s) for c, s in SLOTS.items() if c != "town"]
    groups += [(f"fact:{f}", spec[0]) for f, spec in FACTS.items()]
    for concept, surfaces in groups:
        if len(surfaces) < 3:
            problems.append(f"{concept}: fewer than 3 surfaces")
        seen: set[str] = set()
        for surface in surfaces:
            words = content_words(surface)
            if not words:
                problems.append(f"{concept}: {surface!r} has no content word")
            if words & seen:
                problems.append(f"{concept}: {surface!r} repeats a word of another surface")
            seen |= words
            for w in words:
                if owner.setdefault(w, concept) != concept:
                    problems.append(f"{w!r} is in {owner[w]} and in {concept}")
    templates = [INTRO, *SECTIONS, *LANDMARK_PREPS, "with a an under", *MONTHS, *WEEKDAYS, *FIRST_NAMES]
    templates += [spec[1] + " " + spec[2] for spec in FACTS.values()]
    for text in templates:
        for w in content_words(text.replace("{", " ").replace("}", " ")) - {
            "s",
            "v",
            "x",
            "d",
            "k",
            "c",
            "a",
        }:
            if w in owner:
                problems.append(f"template word {w!r} is a surface of {owner[w]}")
    asked = set().union(
        *(content_words(spec[2].replace("{", " ").replace("}", " ")) for spec in FACTS.values())
    )
    told = set().union(
        *(content_words(spec[1].replace("{", " ").replace("}", " ")) for spec in FACTS.values())
    )
    told |= content_words(INTRO) | content_words(" ".join(SECTIONS))
    if clash := (asked & told) - {"s", "v", "x", "d"}:
        problems.append(f"question templates reuse the sentences' words {sorted(clash)}")
    return problems


def coined_names(heldout: bool) -> list[str]:
    """Every coined place name of one part of the name space (a stable hash splits it)."""
    lexicon = _lexicon_words()
    out = []
    for onset in _ONSETS:
        for mid in _MIDS:
            for end in _ENDS:
                name = (onset + mid + end).capitalize()
                if re.search(r"(.)\1\1", name.casefold()):
                    continue
                if (zlib.crc32(name.encode()) % 100 < HELDOUT_NAME_SHARE) != heldout:
                    continue
                if stem(name) in lexicon or name.casefold() in STOP_WORDS:
                    continue
                out.append(name)
    return out


@dataclass(frozen=True)
class Sentence:
    fact: str
    attributes: tuple[str, ...]  # the three attributes it names
    text: str


@dataclass(frozen=True)
class Document:
    key: str
    name: str
    title: str
    markdown: str
    profile: dict[str, str]  # category -> concept
    # concept slot ("kind", "setting", ..., "emblem", "banners", "fact:founded", ...) -> its surface
    surfaces: dict[str, str]
    sentences: tuple[Sentence, ...]


@dataclass(frozen=True)
class Question:
    id: str
    subset: str  # "shared" | "paraphrased"
    text: str
    key: str  # the answer's document
    passage: str  # the sentence that answers it
    fact: str


@dataclass
class Corpus:
    documents: list[Document]
    questions: list[Question] = field(default_factory=list)

    def by_key(self) -> dict[str, Document]:
        return {d.key: d for d in self.documents}


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _phrase(attribute: str, surfaces: dict[str, str], prep: str) -> str:
    if attribute == "setting":
        return surfaces["setting"]
    if attribute == "landmark":
        return f"{prep} the {surfaces['landmark']}"
    if attribute == "device":
        return f"with {_article(surfaces['device'])} {surfaces['device']} {surfaces['emblem']}"
    if attribute == "colour":
        return f"under {surfaces['colour']} {surfaces['banners']}"
    raise ValueError(attribute)


def _subject(surfaces: dict[str, str], attributes: tuple[str, ...], name: str | None, prep: str) -> str:
    """ "the Varnholt pottery guild on the coast near the lighthouse": the kind, the craft before it when
    named, the other attributes after it."""
    head = " ".join(
        p for p in (name, surfaces["craft"] if "craft" in attributes else None, surfaces["kind"]) if p
    )
    tail = [_phrase(a, surfaces, prep) for a in attributes if a != "craft"]
    return " ".join(["the", head, *tail])


def _fill(template: str, **slots: str) -> str:
    text = template.format(**slots)
    return text[0].upper() + text[1:]


def _value(fact: str, rng: random.Random, surnames: list[str]) -> str:
    if fact == "founded":
        return str(rng.randint(1620, 1985))
    if fact in ("originator", "leader"):
        return f"{rng.choice(FIRST_NAMES)} {rng.choice(surnames)}"
    if fact == "festival":
        return rng.choice(MONTHS)
    if fact == "closed":
        return rng.choice(WEEKDAYS) + "s"
    if fact == "relic":
        return str(rng.randint(1100, 1600))
    if fact == "award":
        return str(rng.randint(1900, 2024))
    low, high = {
        "members": (40, 900), "visitors": (1200, 90000), "distance": (3, 140), "fee": (2, 40),
        "grounds": (2, 90), "output": (100, 5000), "staff": (5, 120), "apprentices": (2, 40),
        "archive": (300, 60000), "capacity": (40, 3000), "elevation": (2, 2800),
    }[fact]  # fmt: skip
    return str(rng.randint(low, high))


def _document(rng: random.Random, name: str, profile: dict[str, str], surnames: list[str]) -> Document:
    surfaces = {cat: rng.choice(CATEGORIES[cat][profile[cat]]) for cat in CATEGORIES}
    surfaces |= {slot: rng.choice(options) for slot, options in SLOTS.items() if slot != "town"}
    surfaces |= {f"fact:{f}": rng.choice(spec[0]) for f, spec in FACTS.items()}
    prep = rng.choice(LANDMARK_PREPS)
    sentences = []
    for fact, (_, told, _) in FACTS.items():
        named = rng.sample(ATTRIBUTES, 3)
        attributes = tuple(a for a in ATTRIBUTES if a in named)
        subject = _subject(surfaces, attributes, name if rng.random() < 0.5 else None, prep)
        text = _fill(told, S=subject, v=surfaces[f"fact:{fact}"], x=_value(fact, rng, surnames))
        sentences.append(Sentence(fact, attributes, text))
    rng.shuffle(sentences)
    title = f"The {name} {surfaces['kind'].capitalize()}"
    everything = ("setting", "landmark", "device", "colour")
    intro = _fill(
        INTRO,
        S=_subject(surfaces, everything, name, prep),
        a=_article(surfaces["kind"]),
        k=surfaces["kind"],
        c=surfaces["craft"],
    )
    parts = [f"# {title}", ""]
    cuts = [0, 4, 9, 14, len(sentences)]
    for i, heading in enumerate(SECTIONS):
        body = sentences[cuts[i] : cuts[i + 1]]
        lines = ([intro] if i == 0 else []) + [s.text for s in body]
        parts += [f"## {heading}", "", " ".join(lines), ""]
    slug = f"{name.casefold()}-{profile['kind']}"
    return Document(
        f"docs/{slug}.md", name, title, "\n".join(parts), dict(profile), surfaces, tuple(sentences)
    )


def _other(rng: random.Random, options: list[str], used: str) -> str:
    return rng.choice([o for o in options if o != used])


def shared_question(doc: Document, sentence: Sentence) -> str:
    asked = FACTS[sentence.fact][2]
    return _fill(asked, D=f"the {doc.name} {doc.surfaces['kind']}", v=doc.surfaces[f"fact:{sentence.fact}"])


def paraphrased_question(rng: random.Random, doc: Document, sentence: Sentence) -> str:
    """The question with another surface for every concept it names (the kind, the sentence's three
    attributes, the fact) and no name."""
    other = {cat: _other(rng, CATEGORIES[cat][doc.profile[cat]], doc.surfaces[cat]) for cat in CATEGORIES}
    other |= {
        slot: _other(rng, options, doc.surfaces[slot]) for slot, options in SLOTS.items() if slot != "town"
    }
    prep = rng.choice(LANDMARK_PREPS)
    subject = _subject(other, sentence.attributes, None, prep)
    fact = _other(rng, FACTS[sentence.fact][0], doc.surfaces[f"fact:{sentence.fact}"])
    return _fill(FACTS[sentence.fact][2], D=subject, v=fact)


def unique_profiles(documents: list[Document], doc: Document, attributes: tuple[str, ...]) -> bool:
    """Whether no other document has the same kind and the same concepts for `attributes`."""
    keys = ("kind", *attributes)
    mine = tuple(doc.profile[k] for k in keys)
    return sum(1 for d in documents if tuple(d.profile[k] for k in keys) == mine) == 1


def _profiles(rng: random.Random, n: int) -> list[dict[str, str]]:
    seen: set[tuple[str, ...]] = set()
    out = []
    while len(out) < n:
        profile = {cat: rng.choice(sorted(table)) for cat, table in CATEGORIES.items()}
        key = tuple(profile.values())
        if key not in seen:
            seen.add(key)
            out.append(profile)
    return out


def documents(n: int, seed: int, heldout: bool) -> list[Document]:
    rng = random.Random(seed)
    names = coined_names(heldout)
    rng.shuffle(names)
    if n > len(names) - 200:
        raise ValueError(f"at most {len(names) - 200} documents in this part of the name space")
    subjects, surnames = names[:n], names[n:]
    return [
        _document(rng, name, profile, surnames)
        for name, profile in zip(subjects, _profiles(rng, n), strict=True)
    ]


def _check(question: str, doc: Document, passage: str, subset: str) -> bool:
    shared = content_words(question) & content_words(passage)
    if subset == "paraphrased":
        return not shared and not (content_words(question) & content_words(doc.markdown))
    return len(shared) >= 2


def heldout(n_docs: int = HELDOUT_DOCS, seed: int = HELDOUT_SEED) -> Corpus:
    """The held-out documents and their questions: one shared and one paraphrased per document,
    about two different sentences."""
    docs = documents(n_docs, seed, heldout=True)
    rng = random.Random(seed + 1)
    questions = []
    for i, doc in enumerate(docs):
        order = list(doc.sentences)
        rng.shuffle(order)
        para = next(s for s in order if unique_profiles(docs, doc, s.attributes))
        shared = next(s for s in order if s is not para)
        text = shared_question(doc, shared)
        assert _check(text, doc, shared.text, "shared"), text
        questions.append(Question(f"s{i}", "shared", text, doc.key, shared.text, shared.fact))
        for _ in range(20):
            text = paraphrased_question(rng, doc, para)
            if _check(text, doc, para.text, "paraphrased"):
                break
        else:
            raise AssertionError(f"no paraphrase of {para.text!r}")
        questions.append(Question(f"p{i}", "paraphrased", text, doc.key, para.text, para.fact))
    return Corpus(docs, questions)


def training(n_docs: int = TRAIN_DOCS, seed: int = TRAIN_SEED) -> Corpus:
    """The training documents (other names, another seed): a shared and a paraphrased question for
    every sentence."""
    docs = documents(n_docs, seed, heldout=False)
    rng = random.Random(seed + 1)
    questions = []
    for i, doc in enumerate(docs):
        for j, sentence in enumerate(doc.sentences):
            questions.append(
                Question(
                    f"s{i}.{j}",
                    "shared",
                    shared_question(doc, sentence),
                    doc.key,
                    sentence.text,
                    sentence.fact,
                )
            )
            text = paraphrased_question(rng, doc, sentence)
            questions.append(
                Question(f"p{i}.{j}", "paraphrased", text, doc.key, sentence.text, sentence.fact)
            )
    return Corpus(docs, questions)


def chunk_texts(doc: Document, size: int, overlap: int) -> list[tuple[str, str]]:
    """(context, text) of each of the document's chunks, cut as AI Search's indexing cuts them."""
    from runtime.ai.search.chunking import chunk_markdown

    return [(c.context, c.text) for c in chunk_markdown(doc.markdown, size, overlap, title=doc.title)]


def normalize_space(text: str) -> str:
    return " ".join(text.split())


def training_pairs(corpus: Corpus, size: int = 256, overlap: int = 10):
    """One dict per question: the question, its sentence, the chunk that holds the sentence (its
    context and text, as the index embeds it) and the other chunks of the document (hard negatives)."""
    by_key = corpus.by_key()
    chunks: dict[str, list[str]] = {}
    for q in corpus.questions:
        if q.key not in chunks:
            chunks[q.key] = [f"{ctx}\n{text}" for ctx, text in chunk_texts(by_key[q.key], size, overlap)]
        pieces = chunks[q.key]
        holding = [i for i, c in enumerate(pieces) if normalize_space(q.passage) in normalize_space(c)]
        best = holding[0] if holding else 0
        yield {
            "query": q.text, "passage": q.passage, "chunk": pieces[best], "subset": q.subset, "key": q.key,
            "fact": q.fact, "negatives": [c for i, c in enumerate(pieces) if i != best],
        }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stats", action="store_true")
    parser.add_argument("--write-heldout", type=Path, metavar="DIR")
    parser.add_argument("--write-train", type=Path, metavar="PATH")
    parser.add_argument("--train-docs", type=int, default=TRAIN_DOCS)
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--chunk-overlap", type=int, default=10)
    args = parser.parse_args(argv)
    if problems := check_lexicon():
        raise SystemExit("lexicon: " + "; ".join(problems))
    if args.write_heldout:
        corpus = heldout()
        for doc in corpus.documents:
            path = args.write_heldout / doc.key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(doc.markdown)
        with open(args.write_heldout / "questions.jsonl", "w") as f:
            for q in corpus.questions:
                f.write(json.dumps(q.__dict__) + "\n")
        print(
            f"{len(corpus.documents)} documents and {len(corpus.questions)} questions in {args.write_heldout}"
        )
    if args.write_train:
        corpus = training(args.train_docs)
        args.write_train.parent.mkdir(parents=True, exist_ok=True)
        with open(args.write_train, "w") as f:
            n = 0
            for pair in training_pairs(corpus, args.chunk_size, args.chunk_overlap):
                f.write(json.dumps(pair) + "\n")
                n += 1
        print(f"{n} training pairs from {len(corpus.documents)} documents in {args.write_train}")
    if args.stats or not (args.write_heldout or args.write_train):
        corpus = heldout()
        sizes = [len(d.markdown.encode()) for d in corpus.documents]
        subsets = {s: sum(q.subset == s for q in corpus.questions) for s in ("shared", "paraphrased")}
        mean = sum(sizes) / len(sizes)
        print(f"held-out: {len(sizes)} documents, {min(sizes)}-{max(sizes)} bytes (mean {mean:.0f})")
        print(f"questions: {subsets}")
        for q in corpus.questions[:4]:
            print(f"  [{q.subset}] {q.text}\n      -> {q.passage}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
