"""Write tuneline's demo datasets: `python data/generate_demo_data.py [--out-dir DIR]`.

The demo world is small and regular on purpose: capitals, opposites, colors, animal sounds,
plurals and simple sums, stated in a few fixed sentence shapes. A tiny model with a ~4k-token
vocabulary can learn the answer formats on a CPU in about a minute, and the held-out questions
(entity and number combinations that no fine-tuning row asks about) show whether it did.
Preference data pairs each question's correct answer in the house format (chosen) with a flawed
one (rejected): a wrong fact, a bare word, a hedge, the question echoed back, or the sentence left
unfinished. Only a wrong fact takes knowing the world to spot; the others break the format. The
KTO set tags single answers, house answers or flawed ones, as desirable or not.
The output is deterministic: the same seed always writes the same bytes. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SEED = 1234
PRETRAIN_LINES = 3000
ALPACA_ROWS = 1500
SHAREGPT_ROWS = 300
PREFERENCE_ROWS = 400
KTO_ROWS = 400

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Portugal": "Lisbon", "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi",
    "Russia": "Moscow", "Canada": "Ottawa", "Mexico": "Mexico City", "Brazil": "Brasilia",
    "Argentina": "Buenos Aires", "Chile": "Santiago", "Peru": "Lima", "Colombia": "Bogota",
    "Egypt": "Cairo", "Kenya": "Nairobi", "Nigeria": "Abuja", "Ghana": "Accra",
    "Morocco": "Rabat", "Ethiopia": "Addis Ababa", "Australia": "Canberra",
    "New Zealand": "Wellington", "Greece": "Athens", "Turkey": "Ankara", "Poland": "Warsaw",
    "Austria": "Vienna", "Hungary": "Budapest", "Sweden": "Stockholm", "Norway": "Oslo",
    "Finland": "Helsinki", "Denmark": "Copenhagen", "Ireland": "Dublin", "Belgium": "Brussels",
    "Switzerland": "Bern", "Romania": "Bucharest", "Ukraine": "Kyiv", "Iran": "Tehran",
    "Iraq": "Baghdad", "Saudi Arabia": "Riyadh", "Pakistan": "Islamabad", "Bangladesh": "Dhaka",
    "Thailand": "Bangkok", "Vietnam": "Hanoi", "Indonesia": "Jakarta", "South Korea": "Seoul",
    "Malaysia": "Kuala Lumpur", "Cuba": "Havana", "Venezuela": "Caracas", "Ecuador": "Quito",
    "Uruguay": "Montevideo", "Iceland": "Reykjavik", "Nepal": "Kathmandu", "Serbia": "Belgrade",
    "Bulgaria": "Sofia", "Croatia": "Zagreb", "Lebanon": "Beirut", "Jordan": "Amman",
    "Qatar": "Doha", "Senegal": "Dakar", "Uganda": "Kampala",
}

OPPOSITE_PAIRS = [
    ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("happy", "sad"), ("up", "down"),
    ("left", "right"), ("open", "closed"), ("wet", "dry"), ("day", "night"), ("hard", "soft"),
    ("full", "empty"), ("young", "old"), ("early", "late"), ("rich", "poor"), ("strong", "weak"),
    ("thick", "thin"), ("loud", "quiet"), ("clean", "dirty"), ("high", "low"), ("push", "pull"),
    ("win", "lose"), ("true", "false"), ("good", "bad"), ("first", "last"), ("north", "south"),
    ("east", "west"), ("buy", "sell"), ("give", "take"), ("near", "far"), ("always", "never"),
    ("before", "after"), ("top", "bottom"),
]
OPPOSITES = {**dict(OPPOSITE_PAIRS), **{b: a for a, b in OPPOSITE_PAIRS}}

# Each thing keeps the article it takes at the start of a sentence ("" for mass nouns).
COLORS = {
    "a banana": "yellow", "a lemon": "yellow", "the sun": "yellow", "a chick": "yellow",
    "corn": "yellow", "a school bus": "yellow", "a strawberry": "red", "a tomato": "red",
    "a cherry": "red", "a fire truck": "red", "a ruby": "red", "blood": "red",
    "a carrot": "orange", "an orange": "orange", "a pumpkin": "orange", "grass": "green",
    "a leaf": "green", "a frog": "green", "a lime": "green", "a cucumber": "green",
    "a pea": "green", "broccoli": "green", "an emerald": "green", "the sky": "blue",
    "the sea": "blue", "a blueberry": "blue", "a sapphire": "blue", "snow": "white",
    "milk": "white", "a cloud": "white", "a swan": "white", "a pearl": "white",
    "a tooth": "white", "coal": "black", "a crow": "black", "a raven": "black", "ink": "black",
    "chocolate": "brown", "coffee": "brown", "soil": "brown", "a potato": "brown",
    "an elephant": "gray", "a stone": "gray", "a pig": "pink", "a flamingo": "pink",
    "a grape": "purple", "an eggplant": "purple", "a plum": "purple", "a violet": "purple",
    "a squirrel": "brown",
}

SOUNDS = {
    "cow": "moo", "dog": "woof", "cat": "meow", "duck": "quack", "sheep": "baa", "pig": "oink",
    "horse": "neigh", "lion": "roar", "owl": "hoot", "bee": "buzz", "snake": "hiss",
    "frog": "ribbit", "mouse": "squeak", "rooster": "cock-a-doodle-doo", "hen": "cluck",
    "donkey": "hee-haw", "wolf": "howl", "crow": "caw", "turkey": "gobble", "dove": "coo",
}

PLURALS = {
    "mouse": "mice", "child": "children", "man": "men", "woman": "women", "foot": "feet",
    "tooth": "teeth", "goose": "geese", "person": "people", "ox": "oxen", "fish": "fish",
    "sheep": "sheep", "deer": "deer", "leaf": "leaves", "knife": "knives", "wolf": "wolves",
    "half": "halves", "box": "boxes", "bus": "buses", "glass": "glasses", "dish": "dishes",
    "church": "churches", "baby": "babies", "city": "cities", "story": "stories",
    "lady": "ladies", "toy": "toys", "day": "days", "key": "keys", "cat": "cats", "dog": "dogs",
    "book": "books", "apple": "apples", "tree": "trees", "car": "cars", "house": "houses",
    "bird": "birds", "hat": "hats", "shoe": "shoes", "potato": "potatoes", "tomato": "tomatoes",
    "hero": "heroes", "piano": "pianos", "photo": "photos", "fox": "foxes", "watch": "watches",
    "brush": "brushes", "party": "parties", "boy": "boys", "girl": "girls", "cup": "cups",
}

# Held out of every fine-tuning row (the pretraining prose still states these facts).
HELD_CAPITALS = ["Kenya", "Sweden", "Peru", "Thailand", "Greece", "Canada", "Nepal",
                 "Morocco", "Austria", "Cuba"]
HELD_OPPOSITES = ["fast", "wet", "full", "loud", "clean", "north", "buy", "near", "before", "bottom"]
HELD_COLORS = ["a lemon", "a tomato", "a carrot", "a frog", "the sea", "milk", "coal", "a plum"]
HELD_SOUNDS = ["duck", "lion", "owl", "donkey"]
HELD_PLURALS = ["goose", "knife", "box", "baby", "tooth", "church", "potato", "fox"]
HELD_SUMS = [(3, 9, "plus"), (14, 5, "plus"), (8, 8, "plus"), (11, 7, "plus"), (6, 13, "plus"),
             (2, 17, "plus"), (19, 4, "plus"), (9, 12, "plus"), (15, 15, "plus"), (7, 20, "plus"),
             (1, 6, "plus"), (18, 10, "plus"), (12, 3, "minus"), (17, 9, "minus"),
             (20, 6, "minus"), (9, 9, "minus"), (15, 8, "minus"), (11, 4, "minus"),
             (16, 13, "minus"), (8, 1, "minus")]

SYSTEMS = ["You are a helpful assistant.", "You answer with one short sentence.",
           "You are a friendly teacher."]
NAMES = ["Tom", "Anna", "Sam", "Mia", "Ben", "Lily", "Max", "Emma", "Leo", "Zoe"]
FRUITS = ["apple", "banana", "plum", "grape", "lemon", "pear"]

# How a rejected (or undesirable) answer goes wrong; the held-out pairs use each equally often.
FLAWS = ("wrong", "bare", "hedged", "echo", "truncated")

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
        "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty"]


@dataclass(frozen=True)
class Fact:
    """One question with its single correct answer, plus the sentence forms that ask it."""

    kind: str
    question: str
    answer: str
    tell: str
    stem: str


def number_word(n: int) -> str:
    """English words for 0..49 ("twenty-one")."""
    if n < 20:
        return ONES[n]
    tens, ones = divmod(n, 10)
    return TENS[tens] + (f"-{ONES[ones]}" if ones else "")


def with_article(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def cap(text: str) -> str:
    return text[0].upper() + text[1:]


def capital_fact(country: str) -> Fact:
    city = CAPITALS[country]
    return Fact("capital", f"What is the capital of {country}?",
                f"The capital of {country} is {city}.", f"Tell me the capital of {country}.",
                f"The capital of {country} is")


def opposite_fact(word: str) -> Fact:
    return Fact("opposite", f"What is the opposite of {word}?",
                f"The opposite of {word} is {OPPOSITES[word]}.",
                f"Tell me the opposite of {word}.", f"The opposite of {word} is")


def color_fact(thing: str) -> Fact:
    return Fact("color", f"What color is {thing}?", f"{cap(thing)} is {COLORS[thing]}.",
                f"Tell me the color of {thing}.", f"{cap(thing)} is")


def sound_fact(animal: str) -> Fact:
    noun = with_article(animal)
    return Fact("sound", f"What sound does {noun} make?", f"{cap(noun)} says {SOUNDS[animal]}.",
                f"Tell me the sound {noun} makes.", f"{cap(noun)} says")


def plural_fact(word: str) -> Fact:
    return Fact("plural", f"What is the plural of {word}?",
                f"The plural of {word} is {PLURALS[word]}.", f"Tell me the plural of {word}.",
                f"The plural of {word} is")


def sum_fact(a: int, b: int, op: str) -> Fact:
    result = a + b if op == "plus" else a - b
    return Fact("arithmetic", f"What is {a} {op} {b}?", f"{a} {op} {b} is {result}.",
                f"Tell me what {a} {op} {b} is.", f"{a} {op} {b} is")


def all_sums() -> list[tuple[int, int, str]]:
    plus = [(a, b, "plus") for a in range(1, 21) for b in range(1, 21)]
    minus = [(a, b, "minus") for a in range(1, 21) for b in range(0, a + 1)]
    return plus + minus


def split_facts(*, held: bool) -> list[Fact]:
    """Facts of every kind: the held-out ones, or all the others (the fine-tuning facts)."""
    groups: list[tuple[list, list, Callable[..., Fact]]] = [
        (list(CAPITALS), HELD_CAPITALS, capital_fact),
        (list(OPPOSITES), HELD_OPPOSITES, opposite_fact),
        (list(COLORS), HELD_COLORS, color_fact),
        (list(SOUNDS), HELD_SOUNDS, sound_fact),
        (list(PLURALS), HELD_PLURALS, plural_fact),
    ]
    facts = []
    for keys, held_keys, make in groups:
        facts += [make(k) for k in keys if (k in held_keys) == held]
    held_sums = set(HELD_SUMS)
    facts += [sum_fact(*s) for s in all_sums() if (s in held_sums) == held]
    return facts


def alpaca_forms(fact: Fact) -> list[dict[str, str]]:
    """The four ways an alpaca row asks one fact; the answer is always the same sentence."""
    return [
        {"instruction": fact.question, "input": "", "output": fact.answer},
        {"instruction": "Answer the question.", "input": fact.question, "output": fact.answer},
        {"instruction": fact.tell, "input": "", "output": fact.answer},
        {"instruction": "Complete the sentence.", "input": fact.stem, "output": fact.answer},
    ]


def build_alpaca(rng: random.Random, facts: list[Fact]) -> list[dict[str, str]]:
    """Every form of every non-arithmetic fact, then sums (two forms) up to ALPACA_ROWS."""
    rows = [row for f in facts if f.kind != "arithmetic" for row in alpaca_forms(f)]
    sums = [f for f in facts if f.kind == "arithmetic"]
    candidates = [row for f in sums for row in alpaca_forms(f)[:2]]
    rows += rng.sample(candidates, ALPACA_ROWS - len(rows))
    rng.shuffle(rows)
    return rows


def build_sharegpt(rng: random.Random, facts: list[Fact]) -> list[dict]:
    """Conversations of 2-3 questions; each question's kind is drawn first, so sums do not
    crowd out the other kinds."""
    by_kind = facts_by_kind(facts)
    rows = []
    for _ in range(SHAREGPT_ROWS):
        turns = []
        kinds = rng.sample(sorted(by_kind), rng.choice([2, 3]))
        for fact in (rng.choice(by_kind[kind]) for kind in kinds):
            ask = fact.question if rng.random() < 0.7 else fact.tell
            turns += [{"from": "human", "value": ask}, {"from": "gpt", "value": fact.answer}]
        system = rng.choice(SYSTEMS) if rng.random() < 0.25 else ""
        rows.append({"conversations": turns, "system": system})
    return rows


def build_heldout(facts: list[Fact]) -> list[dict[str, str]]:
    return [{"instruction": f.question, "input": "", "output": f.answer} for f in facts]


def answer_value(fact: Fact) -> str:
    """The word(s) that answer the question: the answer sentence after its stem, no full stop."""
    return fact.answer[len(fact.stem) + 1 : -1]


def facts_by_kind(facts: list[Fact]) -> dict[str, list[Fact]]:
    by_kind: dict[str, list[Fact]] = {}
    for fact in facts:
        by_kind.setdefault(fact.kind, []).append(fact)
    return by_kind


def flawed_answer(rng: random.Random, fact: Fact, flaw: str, by_kind: dict[str, list[Fact]]) -> str:
    """An answer to `fact` that a careful assistant would not give, spoilt the way `flaw` names."""
    value = answer_value(fact)
    if flaw == "wrong" and fact.kind == "arithmetic":
        return f"{fact.stem} {int(value) + rng.choice([1, 2, 3])}."
    if flaw == "wrong":
        return f"{fact.stem} {rng.choice(sorted({answer_value(f) for f in by_kind[fact.kind]} - {value}))}."
    if flaw == "bare":
        return value.lower()
    if flaw == "hedged":
        return f"I am not sure. Maybe {value}?"
    if flaw == "echo":
        return fact.question
    return fact.stem


def draw_fact(rng: random.Random, by_kind: dict[str, list[Fact]]) -> Fact:
    """A fact whose kind is drawn first, so sums do not crowd out the other kinds."""
    return rng.choice(by_kind[rng.choice(sorted(by_kind))])


def build_preference(rng: random.Random, facts: list[Fact]) -> list[dict[str, str]]:
    """Pairwise rows: a random alpaca form of the question, the house answer, a flawed answer."""
    by_kind = facts_by_kind(facts)
    rows = []
    for _ in range(PREFERENCE_ROWS):
        fact = draw_fact(rng, by_kind)
        form = rng.choice(alpaca_forms(fact))
        rejected = flawed_answer(rng, fact, rng.choice(FLAWS), by_kind)
        rows.append({"instruction": form["instruction"], "input": form["input"], "chosen": fact.answer,
                     "rejected": rejected})
    return rows


def build_preference_heldout(rng: random.Random, held: list[Fact]) -> list[dict[str, str]]:
    """One pair per held-out fact, each flaw in turn; wrong answers come from other held-out facts."""
    by_kind = facts_by_kind(held)
    return [{"instruction": fact.question, "input": "", "chosen": fact.answer,
             "rejected": flawed_answer(rng, fact, FLAWS[number % len(FLAWS)], by_kind)}
            for number, fact in enumerate(held)]


def build_kto(rng: random.Random, facts: list[Fact]) -> list[dict]:
    """Single answers tagged desirable (the house answer) or not (a flawed one), about half each."""
    by_kind = facts_by_kind(facts)
    rows = []
    for _ in range(KTO_ROWS):
        fact = draw_fact(rng, by_kind)
        form = rng.choice(alpaca_forms(fact))
        desirable = rng.random() < 0.5
        output = fact.answer if desirable else flawed_answer(rng, fact, rng.choice(FLAWS), by_kind)
        rows.append({"instruction": form["instruction"], "input": form["input"], "output": output,
                     "kto_tag": desirable})
    return rows


def fact_sentences(rng: random.Random) -> list[str]:
    """One paragraph's sentences about a single kind of fact."""
    kind = rng.choice(["capital", "opposite", "color", "sound", "plural", "words", "digits"])
    count = rng.randint(2, 5)
    if kind == "capital":
        return [rng.choice([f"The capital of {c} is {CAPITALS[c]}.",
                            f"{CAPITALS[c]} is the capital of {c}.",
                            f"{CAPITALS[c]} is a city in {c}."])
                for c in rng.sample(list(CAPITALS), count)]
    if kind == "opposite":
        return [rng.choice([f"The opposite of {w} is {OPPOSITES[w]}.",
                            f"{cap(w)} and {OPPOSITES[w]} are opposites."])
                for w in rng.sample(list(OPPOSITES), count)]
    if kind == "color":
        return [rng.choice([f"{cap(t)} is {COLORS[t]}.", f"The color of {t} is {COLORS[t]}."])
                for t in rng.sample(list(COLORS), count)]
    if kind == "sound":
        return [rng.choice([f"{cap(with_article(a))} says {SOUNDS[a]}.",
                            f"The {a} makes the sound {SOUNDS[a]}."])
                for a in rng.sample(list(SOUNDS), count)]
    if kind == "plural":
        return [rng.choice([f"The plural of {w} is {PLURALS[w]}.",
                            f"One {w}, two {PLURALS[w]}."])
                for w in rng.sample(list(PLURALS), count)]
    return [sum_sentence(rng, words=kind == "words") for _ in range(count)]


def sum_sentence(rng: random.Random, *, words: bool) -> str:
    a, b, op = rng.choice(all_sums())
    result = a + b if op == "plus" else a - b
    if words:
        return cap(f"{number_word(a)} {op} {number_word(b)} is {number_word(result)}.")
    return f"{a} {op} {b} is {result}."


def story_sentences(rng: random.Random) -> list[str]:
    """A short templated story that reuses the facts of the world."""
    name, friend = rng.sample(NAMES, 2)
    kind = rng.randrange(3)
    if kind == 0:
        fruit = rng.choice(FRUITS)
        n, m = rng.randint(2, 9), rng.randint(1, 9)
        return [f"{name} has {number_word(n)} {fruit}s.",
                f"{friend} gives {name} {number_word(m)} more {fruit}{'s' if m > 1 else ''}.",
                f"Now {name} has {number_word(n + m)} {fruit}s."]
    if kind == 1:
        country = rng.choice(list(CAPITALS))
        animal = rng.choice(list(SOUNDS))
        return [f"{name} lives in {CAPITALS[country]}.",
                f"{CAPITALS[country]} is the capital of {country}.",
                f"Every day {name} sees {with_article(animal)}.",
                f"The {animal} says {SOUNDS[animal]}."]
    word = rng.choice([a for a, _ in OPPOSITE_PAIRS])
    thing = rng.choice(list(COLORS))
    return [f"{name} and {friend} play outside.",
            f"{name} says {word} and {friend} says {OPPOSITES[word]}.",
            f"The opposite of {word} is {OPPOSITES[word]}.",
            f"They see that {thing} is {COLORS[thing]}."]


def build_pretrain(rng: random.Random) -> list[dict[str, str]]:
    lines = []
    for _ in range(PRETRAIN_LINES):
        sentences = story_sentences(rng) if rng.random() < 0.25 else fact_sentences(rng)
        lines.append({"text": " ".join(sentences)})
    return lines


def dataset_info() -> dict[str, dict]:
    alpaca_columns = {"prompt": "instruction", "query": "input", "response": "output"}
    ranked_columns = {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}
    return {
        "demo_pretrain": {"file_name": "demo_pretrain.jsonl", "columns": {"prompt": "text"}},
        "demo_alpaca": {"file_name": "demo_alpaca.json", "columns": alpaca_columns},
        "demo_sharegpt": {
            "file_name": "demo_sharegpt.json",
            "formatting": "sharegpt",
            "columns": {"messages": "conversations", "system": "system"},
            "tags": {"role_tag": "from", "content_tag": "value", "user_tag": "human",
                     "assistant_tag": "gpt"},
        },
        "demo_heldout": {"file_name": "demo_heldout.json", "columns": alpaca_columns},
        "demo_preference": {"file_name": "demo_preference.json", "ranking": True, "columns": ranked_columns},
        "demo_preference_heldout": {"file_name": "demo_preference_heldout.json", "ranking": True,
                                    "columns": ranked_columns},
        "demo_kto": {"file_name": "demo_kto.json", "columns": {**alpaca_columns, "kto_tag": "kto_tag"}},
    }


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent)
    out_dir: Path = parser.parse_args(argv).out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    train_facts = split_facts(held=False)
    write_jsonl(out_dir / "demo_pretrain.jsonl", build_pretrain(rng))
    write_json(out_dir / "demo_alpaca.json", build_alpaca(rng, train_facts))
    write_json(out_dir / "demo_sharegpt.json", build_sharegpt(rng, train_facts))
    write_json(out_dir / "demo_heldout.json", build_heldout(split_facts(held=True)))
    # Each later set draws from its own seeded generator, so the sets above keep their bytes.
    write_json(out_dir / "demo_preference.json", build_preference(random.Random(f"{SEED}:preference"), train_facts))
    write_json(out_dir / "demo_preference_heldout.json",
               build_preference_heldout(random.Random(f"{SEED}:preference_heldout"), split_facts(held=True)))
    write_json(out_dir / "demo_kto.json", build_kto(random.Random(f"{SEED}:kto"), train_facts))
    write_json(out_dir / "dataset_info.json", dataset_info())
    print(f"wrote demo datasets to {out_dir}")


if __name__ == "__main__":
    main()
