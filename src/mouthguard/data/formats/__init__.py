"""What a dataset is on a tier, and the hostile-input parsers of each of its formats.

Its layout and name rules (:mod:`.names`), the deterministic tar bytes (:mod:`.tarfmt`),
the shard index (:mod:`.index`), the manifest and its records (:mod:`.manifest`,
:mod:`.records`), the parts a sha256 covers (:mod:`.part`), range hashes
(:mod:`.rangehash`) and the Parquet footer (:mod:`.pqfooter`). Imports nothing else of
:mod:`mouthguard.data`; pyarrow only on use (:mod:`.arrow`).
"""
