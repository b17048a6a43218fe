"""AutoGraph's conversions kept on disk: a fresh process converts nothing
another converted, and computes, fails and reports as if it had."""

import glob
import json
import os

import pytest

# A module of functions AutoGraph rewrites: a tensor `if`, a tensor `while`
# calling another function, and a raise inside converted code.
MODULE = '''\
import tensorflow as tf


def halve_until_small(x):
  steps = tf.constant(0)
  while tf.reduce_max(tf.abs(x)) > LIMIT:
    x = x / 2.0
    steps += 1
  return x, steps


def signed(x):
  if tf.reduce_sum(x) > 0:
    y, steps = halve_until_small(x)
  else:
    y, steps = -x, tf.constant(-1)
  return y, steps


def fails(x):
  if x.shape.rank != 2:
    raise ValueError("fails wants a matrix")
  return x
'''

# Run in a fresh (forked) process: converts, computes, reports as JSON.
PROBE = '''\
import json, sys
import tensorflow as tf
from tfm_ext.training import autograph_cache
sys.path.insert(0, sys.argv[1])
import functions
installed = autograph_cache.install(sys.argv[2])
outputs = {}
for name, value in (("up", [3.0, 40.0]), ("down", [-3.0, 1.0])):
  y, steps = tf.function(functions.signed)(tf.constant(value))
  outputs[name] = [y.numpy().tolist(), int(steps)]
try:
  tf.function(functions.fails)(tf.constant([1.0]))
except ValueError as e:
  outputs["error"] = str(e)
cache = autograph_cache._installed
print(json.dumps({"installed": installed, "outputs": outputs,
                  "hits": cache.hits if cache else 0,
                  "writes": cache.writes if cache else 0}))
'''


@pytest.fixture
def probe(tmp_path, run_forked):
  """`probe(cache_dir, limit, module)`: PROBE's report from a new process."""
  code = tmp_path / "code"
  code.mkdir()
  script = tmp_path / "probe.py"
  script.write_text(PROBE)

  def run(cache_dir, limit=1.0, module=MODULE):
    (code / "functions.py").write_text(module + f"\nLIMIT = {limit}\n")
    proc = run_forked(str(script), str(code), str(cache_dir),
                      env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])

  return run


def _entries(cache_dir):
  return sorted(glob.glob(os.path.join(cache_dir, "*", "*.pkl")))


def test_a_new_process_converts_nothing_and_computes_the_same(probe,
                                                              tmp_path):
  cache = tmp_path / "cache"
  first = probe(cache)
  assert first["installed"] == str(cache)
  # Three functions converted (halve_until_small inside signed's trace),
  # and each written once.
  assert first["hits"] == 0 and first["writes"] == 3, first
  entries = {path: os.stat(path).st_mtime_ns for path in _entries(cache)}
  assert len(entries) == 3
  second = probe(cache)
  assert second["writes"] == 0 and second["hits"] == 3, second
  assert second["outputs"] == first["outputs"]
  # 40 halved 6 times is under 1; -x for a negative sum.
  assert first["outputs"]["up"] == [[3.0 / 64, 40.0 / 64], 6]
  assert first["outputs"]["down"] == [[3.0, -1.0], -1]
  assert {p: os.stat(p).st_mtime_ns for p in _entries(cache)} == entries


def test_an_error_in_cached_code_points_at_the_users_line(probe, tmp_path):
  cache = tmp_path / "cache"
  fresh, cached = probe(cache), probe(cache)
  assert cached["hits"] == 3
  line = MODULE.splitlines().index(
      '    raise ValueError("fails wants a matrix")') + 1
  for report in (fresh, cached):
    # AutoGraph's message names the function's file and line, not the
    # generated module's (the entry's source map).
    assert f'functions.py", line {line}, in fails' in (
        report["outputs"]["error"]), report["outputs"]["error"]
    assert "__autograph_generated_file" not in report["outputs"]["error"]


def test_an_edited_function_is_converted_again(probe, tmp_path):
  cache = tmp_path / "cache"
  probe(cache, limit=1.0)
  # LIMIT is a global: the functions' source and the module's names are
  # the same, so the entries hold; the value is read when the code runs.
  other_value = probe(cache, limit=8.0)
  assert other_value["hits"] == 3 and other_value["writes"] == 0
  assert other_value["outputs"]["up"] == [[3.0 / 8, 40.0 / 8], 3]
  # An edited line is another key: that function is converted and written,
  # and what it computes is the edit's.
  edited = probe(cache, module=MODULE.replace("x = x / 2.0", "x = x / 4.0"))
  assert edited["hits"] == 2 and edited["writes"] == 1, edited
  assert edited["outputs"]["up"] == [[3.0 / 64, 40.0 / 64], 3]
  assert len(_entries(cache)) == 4


@pytest.mark.parametrize("damage", ["truncated", "foreign"])
def test_a_damaged_entry_is_converted_again_and_rewritten(probe, tmp_path,
                                                          damage):
  cache = tmp_path / "cache"
  first = probe(cache)
  for path in _entries(cache):
    with open(path, "r+b") as f:
      if damage == "truncated":
        f.truncate(os.path.getsize(path) // 2)
      else:
        f.write(b"not a pickle at all")
  again = probe(cache)
  assert again["hits"] == 0 and again["writes"] == 3, again
  assert again["outputs"] == first["outputs"]
  assert probe(cache)["hits"] == 3


def test_a_cache_that_cannot_be_made_is_off_and_the_run_goes_on(probe,
                                                                tmp_path):
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  report = probe(a_file / "cache")
  assert report["installed"] is None
  assert report["outputs"]["up"] == [[3.0 / 64, 40.0 / 64], 6]


def test_a_bucket_is_no_cache_directory(tmp_path, monkeypatch):
  from tfm_ext.training import autograph_cache  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(autograph_cache, "_installed", None)
  assert autograph_cache.install("gs://bucket/autograph") is None
  assert not os.listdir(tmp_path)  # No local folder named `gs:`.


def test_off_leaves_autograph_as_it_is(tmp_path, monkeypatch):
  from tfm_ext.training import autograph_cache  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv(autograph_cache.ENV, "off")
  assert autograph_cache.directory_from_environment() is None
  monkeypatch.setenv(autograph_cache.ENV, str(tmp_path / "here"))
  assert autograph_cache.directory_from_environment() == str(tmp_path /
                                                              "here")
  monkeypatch.delenv(autograph_cache.ENV)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert autograph_cache.directory_from_environment() == os.path.join(
      str(tmp_path / "xdg"), "tfm_ext", "autograph")


def test_a_relaunch_of_an_experiment_converts_nothing(launch_forked,
                                                      tmp_path):
  cache = tmp_path / "cache"
  env = {"TFM_EXT_AUTOGRAPH_CACHE": str(cache)}
  args = ("--experiment=digits_convnet", "--mode=train_and_eval",
          "--params_override=trainer.train_steps=4,trainer.steps_per_loop=2")
  first = launch_forked(*args, model_dir=tmp_path / "first", env=env)
  assert first.returncode == 0, first
  # The trainer's step and loop, the task's, the model's: each written.
  entries = {path: os.stat(path).st_mtime_ns for path in _entries(cache)}
  assert len(entries) >= 8, entries
  second = launch_forked(*args, model_dir=tmp_path / "second", env=env)
  assert second.returncode == 0, second
  # Nothing converted, so nothing written: every entry was read.
  assert {p: os.stat(p).st_mtime_ns for p in _entries(cache)} == entries
  assert (second.summary()["global_step"] == first.summary()["global_step"]
          == 4)


def test_entries_unused_for_a_month_are_pruned_once_a_day(probe, tmp_path):
  from tfm_ext.training import autograph_cache  # pylint: disable=g-import-not-at-top
  cache = tmp_path / "cache"
  probe(cache)  # Writes 3 entries, and prunes (nothing) first.
  entries = _entries(cache)
  day = 24 * 3600
  now = os.stat(entries[0]).st_mtime
  old = now - (autograph_cache.UNUSED_DAYS + 1) * day
  os.utime(entries[0], (old, old))
  # Pruned less than a day ago: nothing is looked at.
  assert autograph_cache._prune(str(cache), now=now + 60) == 0
  assert _entries(cache) == entries
  # A day later, the entry unused for a month goes, the others stay.
  assert autograph_cache._prune(str(cache), now=now + day + 60) == 1
  assert _entries(cache) == entries[1:]
  # Reading an entry a day old marks it used.
  stale = now - 2 * day
  os.utime(entries[1], (stale, stale))
  assert probe(cache)["hits"] == 2  # The pruned one is converted again.
  assert os.stat(entries[1]).st_mtime > stale


def test_a_refused_job_makes_no_cache_folder(launch_forked, tmp_path):
  cache = tmp_path / "cache"
  not_a_folder = tmp_path / "model_dir"
  not_a_folder.write_text("a user's file")
  refused = launch_forked("--experiment=digits_convnet", "--mode=train",
                          model_dir=not_a_folder,
                          env={"TFM_EXT_AUTOGRAPH_CACHE": str(cache)})
  assert refused.returncode == 2, refused
  assert not cache.exists()
  assert not_a_folder.read_text() == "a user's file"
