"""A byte/bigram tokenizer that needs no download.

Ids 0-255 are single characters U+0000-U+00FF (Latin-1, so every byte id decodes to exactly one
character and streamed text never has to hold back half a UTF-8 sequence); 256 is BOS, 257 EOS;
then one id per pair of characters from a small alphabet, so that ordinary English text takes
roughly half as many tokens as characters. Characters above U+00FF are encoded as their UTF-8
bytes, one id each.
"""

from __future__ import annotations

BOS_ID = 256
EOS_ID = 257
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 .,!?'-:;"
_FIRST_PAIR = 258
_PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]
_PAIR_ID = {p: _FIRST_PAIR + i for i, p in enumerate(_PAIRS)}
VOCAB_SIZE = _FIRST_PAIR + len(_PAIRS)  # 2283


class Tokenizer:
    """Encode text to ids and ids to text; stateless."""

    vocab_size = VOCAB_SIZE
    bos_id = BOS_ID
    eos_id = EOS_ID

    def encode(self, text: str) -> list[int]:
        """Ids for `text` (no BOS added), greedy: a known pair first, else single characters."""
        ids: list[int] = []
        i = 0
        n = len(text)
        while i < n:
            pair = text[i:i + 2]
            if len(pair) == 2 and pair in _PAIR_ID:
                ids.append(_PAIR_ID[pair])
                i += 2
                continue
            ch = text[i]
            if ord(ch) < 256:
                ids.append(ord(ch))
            else:
                ids.extend(ch.encode("utf-8"))
            i += 1
        return ids

    def piece(self, token_id: int) -> str:
        """The text of one id ("" for BOS/EOS and ids outside the vocabulary)."""
        if 0 <= token_id < 256:
            return chr(token_id)
        if _FIRST_PAIR <= token_id < VOCAB_SIZE:
            return _PAIRS[token_id - _FIRST_PAIR]
        return ""

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, concatenated piece by piece."""
        return "".join(self.piece(i) for i in ids)
