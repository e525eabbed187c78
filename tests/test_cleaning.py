from __future__ import annotations

from stream.intake.cleaning import (
    Cleaner,
    Dropped,
    MemorySeen,
    Prepared,
    clean_text,
    dedup,
    detect_language,
    prepare,
)
from stream.intake.records import Tweet, parse_tweet


def test_clean_text_steps() -> None:
    text = "RT @bob: Sooooo WET!!! Flooding near http://t.co/x and www.news.com the #BigWet… stay safe"
    cleaned = clean_text(text)
    assert cleaned == "sooo wet flooding near #bigwet stay safe"
    assert "@" not in cleaned and "http" not in cleaned


def test_hashtags_stay_and_stop_words_go() -> None:
    assert clean_text("The #Flood is in the city") == "#flood city"


def test_language() -> None:
    assert detect_language("Thousands of people were evacuated after the flood") == "en"
    assert detect_language("Dov'è il piano di ricostruzione? Siamo ancora qui") != "en"


def _tweet(i: int, text: str, lang: str | None = None) -> Tweet:
    return parse_tweet({"id": str(i), "text": text, **({"lang": lang} if lang else {})})


def test_cleaner_drop_reasons() -> None:
    cleaner = Cleaner()
    assert cleaner(_tweet(1, "no hashtags here at all")).reason == "no_hashtags"  # type: ignore[union-attr]
    assert cleaner(_tweet(2, "Terremoto in Emilia #terremoto", lang="it")).reason == "not_english"  # type: ignore[union-attr]
    # lang "und" falls back to the identifier
    assert isinstance(
        cleaner(_tweet(3, "Houses flooded along the river, please help #flood", "und")), Prepared
    )


def test_retweets_of_seen_content_with_the_same_hashtag_are_removed() -> None:
    cleaner = Cleaner(seen=MemorySeen())
    original = cleaner(_tweet(1, "Water rising fast in the valley #flood", "en"))
    assert isinstance(original, Prepared)
    retweet = cleaner(_tweet(2, "RT @x: Water rising fast in the valley #flood", "en"))
    assert isinstance(retweet, Dropped) and retweet.reason == "duplicate_retweet"
    # A retweet of new content is kept; the original posted again (not a retweet) is kept.
    assert isinstance(cleaner(_tweet(3, "RT @y: Roads closed downtown #flood", "en")), Prepared)
    assert isinstance(cleaner(_tweet(4, "Water rising fast in the valley #flood", "en")), Prepared)


def test_partial_duplicate_keeps_only_new_hashtags() -> None:
    prepared = prepare(_tweet(2, "RT @x: Bridge closed by water #flood #roads", "en"))
    assert isinstance(prepared, Prepared) and prepared.hashtags == ("flood", "roads")
    kept = dedup(prepared, [False, True])
    assert isinstance(kept, Prepared)
    assert kept.hashtags == ("roads",) and kept.dedup_keys == prepared.dedup_keys[1:]


def test_redelivery_of_the_same_record_is_idempotent() -> None:
    cleaner = Cleaner()
    tweet = _tweet(7, "RT @x: Evacuation centre open at the school #flood", "en")
    assert isinstance(cleaner(tweet), Prepared)
    assert isinstance(cleaner(tweet), Prepared)  # same claimant: still owns the key


def test_memory_is_bounded() -> None:
    seen = MemorySeen(max_keys=100)
    for i in range(1000):
        seen.claim([f"k{i}"], str(i))
    assert len(seen) == 100


def _plain_steps(text: str) -> str:
    """The cleaning as first written, step by step (the reference ``clean_text`` must equal):
    NLTK folds case itself, every token goes through every expression."""
    from nltk.tokenize import TweetTokenizer
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    from stream.intake.cleaning import _NOT_KEPT_RE, _REPEAT_RE, _URL_RE

    stop_words = frozenset(ENGLISH_STOP_WORDS) | {"rt", "amp", "via"}
    tokenizer = TweetTokenizer(preserve_case=False, reduce_len=True, strip_handles=True)
    words = []
    for token in tokenizer.tokenize(text):
        if _URL_RE.search(token) or token in stop_words:
            continue
        word = _NOT_KEPT_RE.sub("", token)
        if word.startswith("#"):
            word = "#" + word.lstrip("#")
        if not word or word == "#" or word in stop_words:
            continue
        words.append(_REPEAT_RE.sub(r"\1\1\1", word))
    return " ".join(words)


TRICKY = [
    "XD :D :-P ;) <3 :P :p =D 8-) :/ :\\ AAAaaa BbBbBb ooOOoo #FLOOD ##Help #####",
    "WWW.Example.COM HTTP://T.CO/x Bit.LY/abc example.org/page a.b.c x.co",
    "Ünïcödé ÇA VA? ÉÉÉÉé straße ΣΊΣΥΦΟΣ İstanbul ﬁre ＦＵＬＬＷＩＤＴＨ ⅫⅫⅫ ①②",
    "@User RT @x: Heeeeeello!!!! &amp; &lt;3 $100 555-123-4567 +1 (555) 123-4567 ...",
    "_under_ score__ #tag_with_underscores 12345 1st 2nd 3RD 4TH €€€€ ™ 👍🏽👍🏽👍🏽👍🏽",
    "",
    "   ",
    "#",
    "The the THE tHe",
]


def test_clean_text_equals_the_plain_steps_on_every_feed_tweet() -> None:
    """Every tweet of the bundled feed, of a generated feed, and tricky inputs (emoticons in
    upper case, case-folded runs, URLs in capitals, Unicode that lower() changes)."""
    import gzip
    import json

    from workers.adapters.files.feeds import sample_feed
    from workers.dev.synthetic import FeedShape, synthetic_tweets

    with gzip.open(sample_feed(), "rt", encoding="utf-8") as src:
        texts = [json.loads(line).get("text", "") for line in src]
    texts += [t["text"] for t in synthetic_tweets(FeedShape(tweets=2000))]
    texts += TRICKY
    assert len(texts) > 29_000
    differ = [(t, clean_text(t), _plain_steps(t)) for t in texts if clean_text(t) != _plain_steps(t)]
    assert differ == [], differ[:5]
