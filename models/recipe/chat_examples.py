"""Synthetic conversations for the chat corpus: one generator per kind of turn a user sends a chat
or agent worker (facts, docstrings, arithmetic, greetings, identity, "I don't know", everyday
questions, tool calls and their results, JSON extraction, retrieved passages).

Each generator draws from a seeded `random.Random` and a split: "train", or the held-out ones
("heldout": entities never seen in training, where the answer is in the prompt or the rate is only
recorded; "phrasing": question templates never seen in training). Examples are OpenAI-shaped
messages (tool calls as `tool_calls`, results as `tool` turns) so the serving path
(engine.structured.tool_calls.render_messages, then the family's chat template) renders them, and `expect`
says what a right answer holds (models/eval/chat/, `edge models eval --chat`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from models.recipe import chat_facts as facts

FAMILY_NAMES = {
    "kimi": "Kimi K2 mini, a miniature of Moonshot AI's Kimi K2",
    "glm": "GLM-4.5 mini, a miniature of Z.ai's GLM-4.5",
}


@dataclass
class Example:
    kind: str
    messages: list[dict[str, Any]]
    expect: dict[str, Any]
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None
    split: str = "train"
    extra: dict[str, Any] = field(default_factory=dict)


def _tool(name: str, description: str, **props: tuple[str, str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": t, "description": d} for k, (t, d) in props.items()},
                "required": list(props),
            },
        },
    }


TOOLS = {
    "get_weather": _tool("get_weather", "Get the current weather in a city.", city=("string", "The city")),
    "web_search": _tool("web_search", "Search the web.", query=("string", "What to search for")),
    "calculator": _tool(
        "calculator", "Evaluate an arithmetic expression.", expression=("string", "The expression")
    ),
    "get_time": _tool("get_time", "Get the local time in a city.", city=("string", "The city")),
    "book_table": _tool(
        "book_table",
        "Book a table at a restaurant.",
        restaurant=("string", "The restaurant's name"),
        people=("integer", "How many people"),
    ),
}

# question templates: (train phrasings, held-out phrasings)
WEATHER_ASKS = (
    ["What's the weather in {c}?", "How is the weather in {c} today?", "Is it raining in {c}?",
     "Tell me the weather for {c}.", "Weather in {c}, please.", "What is the weather like in {c} right now?",
     "Do I need an umbrella in {c} today?", "how's the weather in {c}"],
    ["Could you check the forecast for {c}?", "I'm heading to {c}. What's the weather like there?"],
)  # fmt: skip
TIME_ASKS = (
    ["What time is it in {c}?", "What's the local time in {c}?", "Tell me the time in {c}.",
     "what time is it in {c} now"],
    ["Do you know the current time in {c}?", "I need the time in {c}, please."],
)  # fmt: skip
SEARCH_ASKS = (
    ["Search the web for {q}.", "Look up {q}.", "Find {q} online.", "Search for {q}.",
     "Please search the web for {q}."],
    ["Can you find information about {q}?", "I'd like you to look up {q} for me."],
)  # fmt: skip
CALC_ASKS = (
    ["Use the calculator: {e}", "Calculate {e}.", "What is {e}? Use the calculator.", "Compute {e}."],
    ["Please work out {e} with the calculator.", "I need the result of {e}."],
)  # fmt: skip
BOOK_ASKS = (
    ["Book a table at {r} for {n} people.", "Reserve a table for {n} at {r}.",
     "Can you book {r} for {n} people?"],
    ["I'd like a table for {n} at {r}, please."],
)  # fmt: skip
SEARCH_TOPICS = (
    "hiking trails near {c}", "museums in {c}", "the history of {c}", "cheap flights to {c}",
    "vegetarian restaurants in {c}", "train times from {c}", "public holidays in {c}",
    "bike rental in {c}", "the population of {c}", "coffee shops in {c}",
)  # fmt: skip
RESTAURANT_WORDS = (
    "Blue Olive Golden Lantern Little Fig Red Maple Silver Spoon Green Garden Old Harbor".split()
)
CAPITAL_ASKS = (
    ["What is the capital of {x}?", "What's the capital city of {x}?", "Which city is the capital of {x}?",
     "capital of {x}?", "Tell me the capital of {x}."],
    ["Name the capital of {x}.", "Where is the seat of government of {x}?", "{x}'s capital is which city?"],
)  # fmt: skip
CURRENCY_ASKS = (
    ["What is the currency of {x}?", "Which currency does {x} use?", "What money is used in {x}?"],
    ["What do people pay with in {x}?", "Name the currency of {x}."],
)  # fmt: skip
ZONE_ASKS = (
    ["What time zone is {x} in?", "Which time zone does {x} use?"],
    ["Tell me the time zone of {x}."],
)  # fmt: skip
LANGUAGE_ASKS = (
    ["What language is spoken in {x}?", "What is the main language of {x}?"],
    ["Which language do people speak in {x}?"],
)  # fmt: skip
DOC_ASKS = (
    ["What does {f} do?", "Explain {f} in one sentence.", "What is {f} for?"],
    ["Describe the Python function {f}."],
)  # fmt: skip
GREETINGS = (
    ["Hello!", "Hi", "Hi there!", "Good morning!", "Hey, how are you?", "Hello, nice to meet you.",
     "Good evening.", "hey"],
    ["Greetings!", "Hello again, how is it going?"],
)  # fmt: skip
GREETING_ANSWERS = [
    "Hello! How can I help you today?",
    "Hi! What can I do for you?",
    "Hello! I'm here to help. What would you like to know?",
    "Hi there! How can I help?",
]
IDENTITY_ASKS = (
    ["Who are you?", "What are you?", "What is your name?", "Which model are you?", "Are you a human?",
     "Tell me about yourself."],
    ["Introduce yourself, please.", "What kind of assistant are you?"],
)  # fmt: skip
UNKNOWN_ASKS = (
    ["What is my name?", "What did I eat for breakfast today?", "What will the stock market do tomorrow?",
     "What number am I thinking of?", "Who will win the next election?", "Where did I park my car?",
     "What is the capital of {z}?", "What is the currency of {z}?", "Who is the mayor of {z}?"],
    ["What is my favourite colour?", "What will the weather be next year?", "What is the population of {z}?"],
)  # fmt: skip
UNKNOWN_ANSWERS = [
    "I don't know. I have no way to know that.",
    "I don't know that, sorry. I can only answer from what I learned or what you tell me.",
    "I don't know. Could you tell me more?",
]
# everyday questions a chat worker gets, with short prose answers (hand-written)
EVERYDAY = [
    ("How do I boil an egg?", "Put the egg in boiling water for about nine minutes, then cool it in cold water and peel it."),
    ("Can you recommend a good book?", "If you like adventure, try Treasure Island by Robert Louis Stevenson. It is short and exciting."),
    ("How can I sleep better?", "Go to bed at the same time every night, keep your room dark and cool, and avoid screens before sleep."),
    ("What should I cook for dinner tonight?", "A simple pasta with tomatoes, garlic and olive oil is quick, cheap and tasty."),
    ("How do I make a cup of tea?", "Boil water, pour it over a tea bag, wait three to five minutes, then remove the bag and add milk if you like."),
    ("Why is the sky blue?", "Sunlight is scattered by the air, and blue light is scattered the most, so the sky looks blue."),
    ("How can I learn a new language?", "Practice a little every day, listen to native speakers and try to speak from the first week."),
    ("What is a good way to save money?", "Write down what you spend, set a budget for each month and put some money aside first."),
    ("How do I stay focused when I work?", "Work in short blocks of time, turn off notifications and take a small break between blocks."),
    ("What are some fun things to do on a rainy day?", "You could read a book, watch a film, bake something or play a board game with friends."),
    ("How much water should I drink a day?", "Most adults do well with about two litres a day, more when it is hot or when you exercise."),
    ("How do I write a good email?", "Keep it short, put the main point in the first sentence and end with a clear question or next step."),
    ("What is the best way to learn to cook?", "Start with a few simple recipes you like and cook them often until you know them well."),
    ("Can you give me a tip for a job interview?", "Prepare short stories about your past work and ask the interviewer a good question at the end."),
    ("How do plants grow?", "Plants use sunlight, water and air to make their own food, and they take minerals from the soil."),
    ("Why do we need sleep?", "Sleep lets the body and the brain rest and repair, and it helps us remember what we learned."),
    ("What is a healthy breakfast?", "Oatmeal with fruit, or eggs with whole grain bread, will keep you full for the morning."),
    ("How do I start running?", "Begin with short, slow runs mixed with walking, three times a week, and add a little more each week."),
    ("How can I be more productive?", "Plan your day the evening before, do the hardest task first and keep your desk tidy."),
    ("What makes a good friend?", "A good friend listens, is honest with you and is there when you need help."),
    ("How do I care for a cat?", "Give it fresh food and water every day, keep its litter box clean and play with it often."),
    ("What is the moon made of?", "The moon is made of rock and dust, with a small iron core in the middle."),
    ("Why do leaves change colour in autumn?", "In autumn trees stop making green chlorophyll, so the yellow and red colours in the leaves show."),
    ("How do I calm down when I am stressed?", "Take a few slow, deep breaths, go for a short walk and talk to someone you trust."),
    ("Can you suggest a weekend trip?", "A small town near the sea or the mountains is a good choice for a quiet weekend."),
    ("How do airplanes fly?", "The wings push air down as the plane moves forward, and the air pushes the wings up."),
    ("What is a good gift for a friend?", "A book they would enjoy, a plant or a nice meal together are all good gifts."),
    ("How do I clean a window without streaks?", "Use warm water with a little vinegar and dry the glass with a clean cloth or newspaper."),
    ("What is the difference between weather and climate?", "Weather is what happens in the sky today; climate is the usual weather of a place over many years."),
    ("How can I remember names better?", "Repeat the name when you hear it, use it in the conversation and link it to something you know."),
    ("What is a balanced diet?", "A balanced diet has vegetables, fruit, whole grains, some protein and not too much sugar or salt."),
    ("Why is exercise important?", "Exercise keeps your heart and muscles strong, improves your mood and helps you sleep."),
    ("How do I plan a small party?", "Pick a date, invite a few friends, prepare simple food and some music, and keep it relaxed."),
    ("What should I pack for a beach holiday?", "Pack light clothes, a swimsuit, sunscreen, a hat, sunglasses and a bottle of water."),
    ("How do I make my room cozy?", "Add soft lights, a warm blanket, a few plants and some pictures you love."),
    ("What is photosynthesis?", "Photosynthesis is how plants turn sunlight, water and carbon dioxide into sugar and oxygen."),
    ("How do I say thank you in Spanish?", "You say gracias."),
    ("Is coffee bad for you?", "A few cups a day are fine for most adults, but too much can make you nervous or keep you awake."),
    ("How do rainbows form?", "Sunlight enters raindrops, bends and splits into its colours, and we see them as a rainbow."),
    ("What is a good hobby to start?", "Drawing, gardening, cooking or playing an instrument are all easy to start and fun to learn."),
    ("How do I ask my boss for a day off?", "Ask early, explain briefly why you need the day and offer a plan for your work while you are away."),
    ("What time of year is best to visit Japan?", "Spring and autumn are lovely, with cherry blossoms in April and red leaves in November."),
    ("Can you tell me a joke?", "Why did the scarecrow win an award? Because he was outstanding in his field."),
    ("How long does it take to walk five kilometres?", "At a normal pace it takes about an hour."),
    ("What is the tallest mountain in the world?", "Mount Everest is the tallest mountain in the world, at about 8,849 metres."),
    ("How many days are in a leap year?", "A leap year has 366 days."),
    ("Why do cats purr?", "Cats purr when they are happy and relaxed, and sometimes to calm themselves."),
    ("How do I keep my phone battery healthy?", "Avoid very hot places, do not let it run empty too often and keep it between 20 and 80 percent."),
]  # fmt: skip
HELDOUT_EVERYDAY_SHARE = 15  # percent of the everyday questions kept for evaluation (by a hash)


def pick(rng: random.Random, asks: tuple[list[str], list[str]], split: str) -> str:
    return rng.choice(asks[1] if split == "phrasing" else asks[0])


def _city(rng: random.Random, split: str) -> str:
    if split == "train" and rng.random() < COINED_SHARE:
        return coined(rng, CITIES_HELD_SET, places=True)
    pool = CITIES_HELD if split == "heldout" else CITIES_TRAIN
    return rng.choice(pool)


def _name(rng: random.Random, split: str) -> str:
    if split == "train" and rng.random() < COINED_SHARE:
        return coined(rng, NAMES_HELD_SET)
    return rng.choice(NAMES_HELD if split == "heldout" else NAMES_TRAIN)


# Half the cities and names of training conversations are coined: a model that met only the real
# ones learns to recall them rather than copy the user's words, and then answers a held-out city
# with a city it knows (measured: "Tomsk" called as "Tunis", "Aqtau" as "Almaty"). A coined word
# can only be copied.
COINED_SHARE = 0.5
_ONSETS = "b br c ch d dr f g gr h j k kh l m n p pr r s sh st t tr v w y z".split()
_VOWELS = "a e i o u a e o ai ou ia ey".split()
_CODAS = ["", "", "", "n", "r", "l", "s", "k", "m", "sk", "nd", "t", "sh"]
_PLACE_WORDS = ("Port", "San", "New", "Lake", "Upper", "Saint")


def coined(rng: random.Random, avoid: set[str], places: bool = False) -> str:
    """A made-up capitalized word of 1-3 syllables (for a place, sometimes two words), never one
    of `avoid` (the held-out entities)."""
    while True:
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
            for _ in range(rng.choice((1, 2, 2, 2, 3)))
        ).capitalize()
        if places and rng.random() < 0.15:
            word = f"{rng.choice(_PLACE_WORDS)} {word}"
        if len(word) > 2 and word not in avoid:
            return word


ALL_CITIES = facts.cities()
# a capital or a country's name is named by the facts the corpus trains: never a held-out city
_NAMED = set(facts.CAPITALS.values()) | set(facts.country_names().values())
CITIES_HELD = [c for c in ALL_CITIES if facts.held_out(c, 15) and c not in _NAMED]
CITIES_TRAIN = [c for c in ALL_CITIES if c not in CITIES_HELD]
NAMES_HELD = [n for n in facts.FIRST_NAMES if facts.held_out(n, 20)]
NAMES_TRAIN = [n for n in facts.FIRST_NAMES if not facts.held_out(n, 20)]
CITIES_HELD_SET, NAMES_HELD_SET = set(CITIES_HELD), set(NAMES_HELD)


def _call(name: str, args: dict[str, Any], i: int) -> dict[str, Any]:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _tools_with(rng: random.Random, needed: list[str]) -> list[dict[str, Any]]:
    """The tools declared: the needed ones among a few others, in a random order."""
    others = [t for t in TOOLS if t not in needed]
    chosen = needed + rng.sample(others, rng.randint(0, min(2, len(others))))
    rng.shuffle(chosen)
    return [TOOLS[t] for t in dict.fromkeys(chosen)]


def _weather(rng: random.Random, city: str) -> tuple[dict[str, Any], str]:
    temp, cond = rng.randint(-5, 35), rng.choice(["sunny", "cloudy", "rainy", "windy", "snowy", "foggy"])
    return {"city": city, "temperature_c": temp, "condition": cond}, f"It is {temp}°C and {cond} in {city}."


def tool_example(rng: random.Random, split: str) -> Example:
    """A request one tool answers (or two, in parallel): the call with arguments from the message,
    then (in training) the tool's result and the answer written from it."""
    kind = rng.choices(["weather", "time", "search", "calc", "book", "two"], [4, 2, 3, 2, 2, 3])[0]
    city = _city(rng, split)
    results: list[tuple[dict[str, Any], str]] = []
    if kind == "weather":
        user, calls = pick(rng, WEATHER_ASKS, split).format(c=city), [("get_weather", {"city": city})]
        results.append(_weather(rng, city))
    elif kind == "time":
        user, calls = pick(rng, TIME_ASKS, split).format(c=city), [("get_time", {"city": city})]
        t = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
        results.append(({"city": city, "time": t}, f"It is {t} in {city}."))
    elif kind == "search":
        query = rng.choice(SEARCH_TOPICS).format(c=city)
        user, calls = pick(rng, SEARCH_ASKS, split).format(q=query), [("web_search", {"query": query})]
        snippet = f"The top result is a guide to {query}."
        results.append(
            ({"results": [{"title": query.title(), "snippet": snippet}]}, f"I found this: {snippet}")
        )
    elif kind == "calc":
        a, b, op = rng.randint(2, 999), rng.randint(2, 99), rng.choice("+-*")
        expr = f"{a} {op} {b}"
        user, calls = pick(rng, CALC_ASKS, split).format(e=expr), [("calculator", {"expression": expr})]
        value = eval(expr)  # noqa: S307 - two small integers and one operator, built just above
        results.append(({"result": value}, f"{expr} = {value}."))
    elif kind == "book":
        name = f"{rng.choice(RESTAURANT_WORDS)} {rng.choice(RESTAURANT_WORDS)}"
        if split == "heldout":
            name = f"{name} {city}"
        n = rng.randint(2, 12)
        user = pick(rng, BOOK_ASKS, split).format(r=name, n=n)
        calls = [("book_table", {"restaurant": name, "people": n})]
        results.append(({"booked": True}, f"Done: a table for {n} at {name} is booked."))
    else:
        other = _city(rng, split)
        while other == city:
            other = _city(rng, split)
        user = rng.choice(
            [
                f"What's the weather in {city} and in {other}?",
                f"Compare the weather in {city} and {other}.",
                f"How is the weather in {city} and {other} today?",
            ]
        )
        calls = [("get_weather", {"city": city}), ("get_weather", {"city": other})]
        results += [_weather(rng, city), _weather(rng, other)]
    tools = _tools_with(rng, [c[0] for c in calls])
    tool_calls = [_call(name, args, i) for i, (name, args) in enumerate(calls)]
    messages: list[dict[str, Any]] = [{"role": "user", "content": user}]
    expect = {"calls": [{"name": n, "arguments": a} for n, a in calls]}
    if split == "train":
        messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
        for call, (result, _) in zip(tool_calls, results, strict=True):
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
        messages.append({"role": "assistant", "content": " ".join(answer for _, answer in results)})
    return Example("parallel_tool" if len(calls) > 1 else "tool", messages, expect, tools=tools, split=split)


def no_call_example(rng: random.Random, split: str) -> Example:
    """Tools declared, but the message needs none: a plain answer, no call."""
    ex = rng.choice([greeting_example, everyday_example, capital_example])(rng, split)
    ex.tools = _tools_with(rng, [rng.choice(list(TOOLS))])
    return ex


def _answer(question: str, answer: str, kind: str, expect: dict[str, Any], split: str) -> Example:
    return Example(
        kind,
        [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
        expect,
        split=split,
    )


def capital_example(rng: random.Random, split: str) -> Example:
    country, capital = rng.choice(sorted(facts.CAPITALS.items()))
    q = pick(rng, CAPITAL_ASKS, split).format(x=country)
    a = rng.choice([f"The capital of {country} is {capital}.", f"{capital} is the capital of {country}."])
    return _answer(q, a, _fact_kind(split), {"any": [capital]}, split)


def _fact_kind(split: str) -> str:
    return "fact_phrasing" if split == "phrasing" else "fact_seen"


def currency_example(rng: random.Random, split: str) -> Example:
    country, (name, code) = rng.choice(sorted(CURRENCIES.items()))
    q = pick(rng, CURRENCY_ASKS, split).format(x=country)
    return _answer(q, f"{country} uses the {name} ({code}).", _fact_kind(split), {"any": [name, code]}, split)


def zone_example(rng: random.Random, split: str) -> Example:
    country, zone = rng.choice(sorted(COUNTRY_ZONES.items()))
    q = pick(rng, ZONE_ASKS, split).format(x=country)
    return _answer(q, f"{country} is in the {zone} time zone.", _fact_kind(split), {"any": [zone]}, split)


def language_example(rng: random.Random, split: str) -> Example:
    country, lang = rng.choice(sorted(facts.LANGUAGES.items()))
    q = pick(rng, LANGUAGE_ASKS, split).format(x=country)
    return _answer(q, f"The main language of {country} is {lang}.", _fact_kind(split), {"any": [lang]}, split)


def docstring_example(rng: random.Random, split: str) -> Example:
    pool = DOCS_HELD if split == "heldout" else DOCS_TRAIN
    fn = rng.choice(pool)
    sentence = DOCS[fn]
    q = pick(rng, DOC_ASKS, split).format(f=fn)
    a = f"{fn}: {sentence}"
    words = sorted(
        {w.strip(".,;:()'\"`").lower() for w in sentence.split() if len(w.strip(".,;:()'\"`")) >= 5}
    )
    return _answer(q, a, "docstring", {"words": words, "min": min(2, len(words))}, split)


def arithmetic_example(rng: random.Random, split: str) -> Example:
    a, b = rng.randint(0, 50), rng.randint(0, 50)
    op = rng.choice(["+", "-"])
    value = a + b if op == "+" else a - b
    q = rng.choice([f"What is {a} {op} {b}?", f"How much is {a} {op} {b}?", f"{a} {op} {b} = ?"])
    return _answer(q, f"{a} {op} {b} = {value}.", "arithmetic", {"any": [str(value)]}, split)


def greeting_example(rng: random.Random, split: str) -> Example:
    return _answer(
        pick(rng, GREETINGS, split), rng.choice(GREETING_ANSWERS), "greeting", {"prose": True}, split
    )


def identity_example(rng: random.Random, split: str, family: str = "kimi") -> Example:
    who = FAMILY_NAMES[family]
    a = rng.choice(
        [
            f"I am {who}, served locally by edge-workers. I can chat, answer simple questions and call tools.",
            f"I'm {who}. I am a small language model running on your machine, not a human.",
        ]
    )
    return _answer(pick(rng, IDENTITY_ASKS, split), a, "identity", {"prose": True}, split)


def _made_up(rng: random.Random) -> str:
    return "".join(
        rng.choice(["Zor", "Vel", "Qua", "Mib", "Tar", "Ulo", "Kesh", "Pry", "Dran"]) for _ in range(2)
    ) + rng.choice(["ia", "land", "stan", "ovar"])


def unknown_example(rng: random.Random, split: str) -> Example:
    q = pick(rng, UNKNOWN_ASKS, split).format(z=_made_up(rng))
    return _answer(q, rng.choice(UNKNOWN_ANSWERS), "fact_unknown", {"unknown": True}, split)


def everyday_example(rng: random.Random, split: str) -> Example:
    pool = EVERYDAY_HELD if split in ("heldout", "phrasing") else EVERYDAY_TRAIN
    q, a = rng.choice(pool)
    return _answer(q, a, "chat", {"prose": True}, split)


SCHEMAS = {
    "person": (
        "Extract the person from the user's text as JSON with the keys name (string), age (integer) and "
        "city (string). Answer with the JSON object only.",
        {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
         "city": {"type": "string"}}, "required": ["name", "age", "city"]},
    ),
    "meeting": (
        "Extract the meeting from the user's text as JSON with the keys who (string), day (string) and "
        "hour (integer). Answer with the JSON object only.",
        {"type": "object", "properties": {"who": {"type": "string"}, "day": {"type": "string"},
         "hour": {"type": "integer"}}, "required": ["who", "day", "hour"]},
    ),
}  # fmt: skip
PERSON_SAYS = (
    ["{n} is {a} years old and lives in {c}.", "My friend {n}, who is {a}, lives in {c}.",
     "{n} lives in {c}. She is {a}.", "Meet {n} from {c}, age {a}."],
    ["Living in {c}, {n} turned {a} this year."],
)  # fmt: skip
MEETING_SAYS = (
    ["I have a meeting with {n} on {d} at {h} o'clock.", "Meet {n} on {d} at {h}.",
     "On {d} at {h} I will see {n}."],
    ["{n} wants to meet at {h} on {d}."],
)  # fmt: skip
DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()


def json_example(rng: random.Random, split: str) -> Example:
    which = rng.choice(sorted(SCHEMAS))
    system, schema = SCHEMAS[which]
    name = _name(rng, split)
    if which == "person":
        obj = {"name": name, "age": rng.randint(18, 90), "city": _city(rng, split)}
        text = pick(rng, PERSON_SAYS, split).format(n=name, a=obj["age"], c=obj["city"])
    else:
        obj = {"who": name, "day": rng.choice(DAYS), "hour": rng.randint(8, 18)}
        text = pick(rng, MEETING_SAYS, split).format(n=name, d=obj["day"], h=obj["hour"])
    messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    if split == "train":
        messages.append({"role": "assistant", "content": json.dumps(obj)})
    fmt = {"type": "json_schema", "json_schema": {"name": which, "schema": schema}}
    return Example("json", messages, {"object": obj}, response_format=fmt, split=split)


SHOPS = ["bakery", "bookshop", "cafe", "flower shop", "bike shop", "gym", "library", "pharmacy"]


def rag_example(rng: random.Random, split: str) -> Example:
    """A question with three retrieved passages in the prompt, answered from the one that holds it."""
    if split == "train":
        names = list(dict.fromkeys(_name(rng, split) for _ in range(3)))
        while len(names) < 3:
            names = list(dict.fromkeys([*names, _name(rng, split)]))
    else:
        names = rng.sample(NAMES_HELD if split == "heldout" else NAMES_TRAIN, 3)
    passages = []
    for n in names:
        shop, city, hour = rng.choice(SHOPS), _city(rng, split), rng.randint(6, 11)
        passages.append((n, shop, city, hour))
    n, shop, city, hour = rng.choice(passages)
    context = "\n".join(
        f"[{i + 1}] {p[0]} runs a {p[1]} in {p[2]} that opens at {p[3]} am." for i, p in enumerate(passages)
    )
    system = f"Answer the question from these passages.\n{context}"
    if rng.random() < 0.5:
        q, a, want = f"When does {n}'s {shop} open?", f"{n}'s {shop} opens at {hour} am.", f"{hour} am"
    else:
        q, a, want = f"In which city is {n}'s {shop}?", f"{n}'s {shop} is in {city}.", city
    return Example("rag", [{"role": "system", "content": system}, {"role": "user", "content": q},
                           {"role": "assistant", "content": a}], {"any": [want]}, split=split)  # fmt: skip


# the facts a 6M-parameter model can hold: those of the countries the hand-written table names
CURRENCIES = {k: v for k, v in facts.currencies().items() if k in facts.CAPITALS}
COUNTRY_ZONES = {k: v for k, v in facts.country_zones().items() if k in facts.CAPITALS}
DOCS = facts.docstrings()
DOCS_HELD = sorted(f for f in DOCS if facts.held_out(f, 15))
DOCS_TRAIN = sorted(f for f in DOCS if not facts.held_out(f, 15))
EVERYDAY_HELD = [qa for qa in EVERYDAY if facts.held_out(qa[0], HELDOUT_EVERYDAY_SHARE)]
EVERYDAY_TRAIN = [qa for qa in EVERYDAY if not facts.held_out(qa[0], HELDOUT_EVERYDAY_SHARE)]

# kind -> (generator, weight in training)
GENERATORS = {
    "tool": (tool_example, 22),
    "no_call": (no_call_example, 4),
    "capital": (capital_example, 14),
    "currency": (currency_example, 8),
    "zone": (zone_example, 5),
    "language": (language_example, 4),
    "docstring": (docstring_example, 8),
    "arithmetic": (arithmetic_example, 3),
    "greeting": (greeting_example, 3),
    "identity": (identity_example, 3),
    "unknown": (unknown_example, 4),
    "everyday": (everyday_example, 8),
    "json": (json_example, 10),
    "rag": (rag_example, 8),
}
