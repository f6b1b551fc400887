#include "eval/words.hpp"

namespace masskv::eval {
namespace {

constexpr std::string_view kAdjectives[] = {
    "ancient", "bitter", "brave",    "bright",   "clever",  "cloudy", "crimson", "curious",
    "dusty",   "eager",  "elegant",  "fancy",    "fierce",  "fluffy", "frozen",  "gentle",
    "giant",   "golden", "graceful", "grumpy",   "happy",   "hidden", "hollow",  "humble",
    "jolly",   "lively", "lonely",   "lucky",    "mellow",  "misty",  "modern",  "muddy",
    "narrow",  "noble",  "orange",   "patient",  "plain",   "polite", "proud",   "purple",
    "quiet",   "rapid",  "rusty",    "sandy",    "scarlet", "shiny",  "silent",  "silver",
    "simple",  "sleepy", "smooth",   "snowy",    "solid",   "spicy",  "steady",  "sticky",
    "stormy",  "sunny",  "swift",    "tender",   "violet",  "windy",  "wooden",  "young",
    "zesty",   "velvet", "amber",    "azure",    "breezy",  "bumpy",  "candid",  "cheerful",
    "chilly",  "dainty", "dizzy",    "fragrant", "frosty",  "fuzzy",  "glossy",  "hasty",
    "jagged",  "juicy",  "lavish",   "nimble",   "rugged",  "serene", "shaggy",  "sturdy",
};

constexpr std::string_view kNouns[] = {
    "cabbage", "lantern", "meadow",     "harbor",    "pebble",    "falcon",  "orchard",
    "violin",  "compass", "tortoise",   "pumpkin",   "glacier",   "biscuit", "cactus",
    "dolphin", "emerald", "feather",    "garden",    "hammock",   "island",  "jacket",
    "kettle",  "ladder",  "magnet",     "napkin",    "oyster",    "parrot",  "quilt",
    "rabbit",  "saddle",  "teapot",     "umbrella",  "valley",    "walrus",  "yogurt",
    "zebra",   "anchor",  "blanket",    "candle",    "desert",    "engine",  "forest",
    "guitar",  "helmet",  "igloo",      "jungle",    "kitten",    "lemon",   "mirror",
    "noodle",  "ocean",   "pencil",     "quarry",    "river",     "spoon",   "tiger",
    "tunnel",  "volcano", "wagon",      "window",    "badger",    "bucket",  "camera",
    "donkey",  "eagle",   "fountain",   "goblet",    "hedgehog",  "iceberg", "jigsaw",
    "kayak",   "lobster", "mango",      "otter",     "penguin",   "pillow",  "rocket",
    "sparrow", "tomato",  "trumpet",    "turnip",    "walnut",    "whistle", "acorn",
    "banjo",   "beetle",  "carrot",     "cherry",    "cobweb",    "cricket", "daisy",
    "dragon",  "ferret",  "fiddle",     "goose",     "grape",     "hamster", "koala",
    "lizard",  "llama",   "meteor",     "moose",     "mushroom",  "onion",   "panda",
    "peach",   "pepper",  "pirate",     "puffin",    "radish",    "raven",   "robot",
    "salmon",  "scarf",   "shovel",     "squid",     "statue",    "tractor", "tulip",
    "turtle",  "unicorn", "waffle",     "wizard",    "yacht",     "bagel",   "basket",
    "beacon",  "bottle",  "castle",     "comet",     "cookie",    "crystal", "cushion",
    "easel",   "ferry",   "garlic",     "gravel",    "icicle",    "lagoon",  "lettuce",
    "mitten",  "muffin",  "nutmeg",     "paddle",    "pearl",     "pickle",  "planet",
    "prism",   "puzzle",  "quiver",     "ribbon",    "sapphire",  "spider",  "sponge",
    "thimble", "timber",  "torch",      "trolley",   "vessel",    "wallet",  "whale",
    "zipper",  "apricot", "lighthouse", "saxophone", "hurricane", "giraffe", "octopus",
    "pelican", "satchel", "trellis",
};

}  // namespace

std::span<const std::string_view> adjectives() { return kAdjectives; }
std::span<const std::string_view> nouns() { return kNouns; }

}  // namespace masskv::eval
