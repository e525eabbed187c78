from __future__ import annotations

from stream.cleaning import (
    Cleaner,
    Dropped,
    MemorySeen,
    Prepared,
    clean_text,
    dedup,
    detect_language,
    prepare,
)
from stream.records import Tweet, parse_tweet


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
