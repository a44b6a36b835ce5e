"""docs/config.md's allowed column says each range once (issue 70, item 6b): the episode keys
were refused twice in two wordings, by their section check (``it must be a number >= 0``) and,
for a NaN, by ``SlowEpisodes`` (``it must be a finite number >= 0.0``)."""

import pytest

from nbsgd_jax import config_doc


@pytest.mark.parametrize("key,want", [("cluster.episode_rate", "it must be a number >= 0"),
                                      ("cluster.episode_median", "it must be a number > 0"),
                                      ("cluster.episode_sigma", "it must be a number >= 0"),
                                      ("cluster.episode_factor", "it must be a number >= 1")])
def test_the_episode_keys_allowed_text_says_their_range_once(key, want):
  assert config_doc.allowed_values(key) == [want]


def test_one_per_range_keeps_the_first_wording_of_a_range_and_every_other_rule():
  got = config_doc.one_per_range([
      "it must be a number > 0 and <= 1", "it must be a finite number > 0.0 and <= 1.0",
      "it must be a number >= 0", "it must be a finite number > 0", "use True or False"])
  assert got == ["it must be a number > 0 and <= 1", "it must be a number >= 0",
                 "it must be a finite number > 0", "use True or False"]
