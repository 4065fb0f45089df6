"""Simple facts with one-word answers, the shared pool of the `terse` and `verbose` domains.
Each entry: (question, accepted answers); the first answer is the canonical one."""

from __future__ import annotations

_CAPITALS = (
    ("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Germany", "Berlin"),
    ("Egypt", "Cairo"), ("Russia", "Moscow"), ("Greece", "Athens"), ("Portugal", "Lisbon"), ("Norway", "Oslo"),
    ("Sweden", "Stockholm"), ("Ireland", "Dublin"), ("Austria", "Vienna"), ("Poland", "Warsaw"),
    ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Cuba", "Havana"), ("Canada", "Ottawa"), ("China", "Beijing"),
    ("Thailand", "Bangkok"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Hungary", "Budapest"),
    ("Belgium", "Brussels"), ("Australia", "Canberra"), ("Chile", "Santiago"), ("Turkey", "Ankara"),
    ("Iran", "Tehran"), ("Switzerland", "Bern"), ("England", "London"),
)
_COLOURS = (
    ("the sky on a clear day", "blue"), ("fresh grass", "green"), ("snow", "white"), ("a ripe banana", "yellow"),
    ("coal", "black"), ("a ripe tomato", "red"), ("an orange", "orange"), ("a lemon", "yellow"),
    ("milk", "white"), ("a fire truck", "red"), ("a crow", "black"), ("an emerald", "green"),
)
_OTHER = (
    ("How many legs does a spider have?", ("eight", "8")),
    ("How many legs does a dog have?", ("four", "4")),
    ("How many days are in a week?", ("seven", "7")),
    ("How many months are in a year?", ("twelve", "12")),
    ("How many sides does a triangle have?", ("three", "3")),
    ("How many wheels does a bicycle have?", ("two", "2")),
    ("What animal says moo?", ("cow", "cows")),
    ("What animal barks?", ("dog", "dogs")),
    ("What animal meows?", ("cat", "cats")),
    ("What animal is known as the king of the jungle?", ("lion",)),
    ("What is the largest ocean on Earth?", ("Pacific",)),
    ("What is the closest star to Earth?", ("Sun",)),
    ("What planet do we live on?", ("Earth",)),
    ("What is frozen water called?", ("ice",)),
    ("What do bees make?", ("honey",)),
    ("What is the opposite of hot?", ("cold",)),
    ("What is the opposite of up?", ("down",)),
    ("What is the opposite of day?", ("night",)),
    ("What is the opposite of big?", ("small", "little")),
    ("What is the opposite of fast?", ("slow",)),
    ("What is the opposite of happy?", ("sad", "unhappy")),
    ("What is the opposite of open?", ("closed", "shut")),
    ("What is the opposite of wet?", ("dry",)),
    ("Which season comes after winter?", ("spring",)),
    ("Which season comes after summer?", ("autumn", "fall")),
    ("What is the first month of the year?", ("January",)),
    ("What is the last month of the year?", ("December",)),
    ("Which day comes after Monday?", ("Tuesday",)),
    ("Which day comes after Friday?", ("Saturday",)),
    ("What do cows drink?", ("water",)),
    ("What do you call a baby dog?", ("puppy", "pup")),
    ("What do you call a baby cat?", ("kitten",)),
    ("What is the main language spoken in Brazil?", ("Portuguese",)),
    ("What is the main language spoken in France?", ("French",)),
    ("What metal is liquid at room temperature?", ("mercury",)),
    ("What is the hardest natural material?", ("diamond", "diamonds")),
    ("What organ pumps blood through the body?", ("heart",)),
    ("What do caterpillars turn into?", ("butterflies", "butterfly", "moths", "moth")),
    ("What is the tallest animal?", ("giraffe", "giraffes")),
)

FACTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    *((f"What is the capital of {country}?", (city,)) for country, city in _CAPITALS),
    *((f"What colour is {thing}?", (colour,)) for thing, colour in _COLOURS),
    *_OTHER,
)
