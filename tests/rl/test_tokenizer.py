import pytest

from trace_rl.tokenizer import CharTokenizer, HFTokenizer, load_tokenizer


def test_char_tokenizer_round_trip():
    tok = CharTokenizer()
    assert tok.vocab_size == 96 and (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    text = "Sort: 3 1 2 -> [1, 2, 3]\n12+34=46"
    ids = tok.encode(text, add_bos=True)
    assert ids[0] == tok.bos_id and max(ids) < tok.vocab_size and min(ids[1:]) >= 3
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_id, tok.pad_id], skip_special=False).endswith("<eos><pad>")
    with pytest.raises(ValueError, match="'é'"):
        tok.encode("café")
    with pytest.raises(ValueError, match="outside"):
        tok.decode([200])


def test_tokenizer_json_loads(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<unk>": 0, "hello": 1, "world": 2}
    t = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    t.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text('{"bos_token_id": 0, "eos_token_id": [2]}')
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, HFTokenizer) and tok.eos_id == 2
    assert tok.encode("hello world") == [1, 2] and tok.vocab_size == 3
    assert isinstance(load_tokenizer(tmp_path / "none"), CharTokenizer)
