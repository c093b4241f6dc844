"""Bad input to scripts/decode.py: a non-zero exit and a message naming the problem.

Never an exit 0 with wrong output, and never a partial file under the output
name. All cases run in one subprocess (tests/cli_driver.py calls decode.py's
`main` per case, real signals and a file size limit included), which saves
the 8-9 s (imports, loading, compiling) a decode.py process each would cost
(tests/infer_test.py runs scripts/decode.py itself, error exits included).
"""

import json
import pathlib
import signal
import subprocess
import sys

import jax
import orbax.checkpoint as ocp
import pytest
import sentencepiece

from spec_decode import checkpoints
from spec_decode import data
from spec_decode import models
from spec_decode import text
from spec_decode.cli import settings
from spec_decode.cli.gin_utils import ConfigError
from spec_decode.t5 import t5_1_1

TESTS = pathlib.Path(__file__).resolve().parent
INPUTS = 'A man is riding a bicycle.\nTwo dogs play in the snow.\n'


@pytest.fixture(scope='module')
def files(tmp_path_factory):
  """Checkpoints (a tiny target, its NaN copy, a corrupt one), vocabularies, inputs, run files."""
  d = tmp_path_factory.mktemp('cli')
  target = models.T5Model.random(t5_1_1('tiny', vocab_size=8192), jax.random.key(0))
  checkpoints.write_t5x(str(d / 'target'), target.params)
  checkpoints.write_t5x(str(d / 'nan'), jax.tree.map(lambda x: x * float('nan'), target.params))
  # One +inf column in the output layer: its logit is NaN (inf times mixed signs) or inf.
  params = jax.tree.map(lambda x: x, target.params)
  params['decoder']['logits_dense']['kernel'] = (
      params['decoder']['logits_dense']['kernel'].at[:, 100].set(float('inf')))
  checkpoints.write_t5x(str(d / 'inf_column'), params)
  # A checkpoint that records another vocabulary of the same size (another training's).
  checkpoints.write_t5x(str(d / 'other_vocabulary'), target.params, vocabulary=data.VOCAB_PATH)
  record = d / 'other_vocabulary' / checkpoints.SIDECAR
  record.write_text(json.dumps(dict(json.loads(record.read_text()), sha256='0' * 64)))
  ocp.PyTreeCheckpointer().save(str(d / 'orbax_target' / 'state'), {'target': target.params})
  (d / 'corrupt').mkdir()
  (d / 'corrupt' / 'checkpoint').write_bytes(b'not msgpack')  # loading it would fail
  sentencepiece.SentencePieceTrainer.train(
      input=str(data.DATA_DIR / 'multi30k_en_de' / 'val.en'), model_prefix=str(d / 'spm500'),
      vocab_size=500, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
  (d / 'not_sentencepiece.model').write_text('not a model\n')
  (d / 'inputs.txt').write_text(INPUTS)
  (d / 'latin1.txt').write_bytes('First line.\nA caf\xe9 in Paris.\n'.encode('latin-1'))
  (d / 'fields.jsonl').write_text('{"inputs": "A dog.", "line": 7, "batch": "b1"}\n')
  (d / 'beam_fields.jsonl').write_text('{"inputs": "A dog.", "score": 0.5, "beams": []}\n')
  (d / 'blank.txt').write_text('One.\n\nTwo.\n')
  (d / 'invisible.txt').write_text('One.\n\u200b\u200b\u200b\n', encoding='utf-8')
  (d / 'surrogate.jsonl').write_text('{"inputs": "A dog."}\n{"inputs": "A \\ud800 dog."}\n')
  (d / 'broken.jsonl').write_text('{"inputs": "A dog."}\n{"inputs": "A cat.",\n')
  (d / 'empty.txt').write_bytes(b'\xef\xbb\xbf')
  (d / 'many.txt').write_text('A man is riding a bicycle.\n' * 300)
  (d / 'twenty.txt').write_text('A man is riding a bicycle.\n' * 20)
  for run in ('decode', 'baseline'):
    lines = [
        'from __gin__ import dynamic_registration', 'from spec_decode import t5',
        f"include 'runs/{run}.gin'", "include 'models/tiny.gin'",
        'TARGET_CONFIG = @tiny/t5.T5Config()', f"TARGET_CHECKPOINT = '{d / 'target'}'",
        f"VOCABULARY_FILE = '{data.VOCAB_PATH}'", f"INPUT_FILE = '{d / 'inputs.txt'}'",
        f"OUTPUT_FILE = '{d / 'out.jsonl'}'", 'MAX_INPUT_LEN = 24', 'MAX_DECODE_LEN = 8']
    if run == 'decode':
      lines += ['DRAFT_CONFIG = @tiny/t5.T5Config()', f"DRAFT_CHECKPOINT = '{d / 'target'}'"]
    (d / f'{run}.gin').write_text('\n'.join(lines) + '\n')
  return d


# name: (flags after --gin_file=decode.gin, the message stderr must hold)
_PROCESSES = '--gin_file=runs/sharded/processes.gin'
CASES = {
    'vocabulary_not_the_checkpoints': (["--gin.DRAFT_CHECKPOINT='{d}/other_vocabulary'"],
                                       'vocabulary mismatch: '),
    'vocabulary_not_the_checkpoints_override': (
        ["--gin.DRAFT_CHECKPOINT='{d}/other_vocabulary'"], '--gin.ALLOW_VOCABULARY_MISMATCH=True'),
    'draft_top_k_negative': (['--gin.DRAFT_TOP_K=-1'],
                             "the draft's knobs (DRAFT_TEMPERATURE, DRAFT_TOP_K, DRAFT_TOP_P in "
                             'gin): top_k'),
    'draft_top_p_quoted': (["--gin.DRAFT_TOP_P='0.9'"],
                           'draft_top_p (DRAFT_TOP_P in gin) must be a number or None'),
    'smaller_vocabulary': (["--gin.VOCABULARY_FILE='{d}/spm500.model'"],
                           "the vocabulary ({d}/spm500.model) has 500 ids but the models' "
                           'vocab_size is 8192 (expected 500..512'),
    'misspelt_macro': (['--gin.TEMPRATURE=0.7'],
                       'no gin file uses the macro TEMPRATURE (did you mean TEMPERATURE or '),
    'model_parallel_without_mesh': (['--gin.MODEL_PARALLEL=2'],
                                    'no gin file uses the macro MODEL_PARALLEL '
                                    '(--gin_file=runs/sharded/mesh.gin uses it)'),
    'nan_logits': (["--gin.TARGET_CHECKPOINT='{d}/nan'"],
                   'input line(s) 1, 2: a model returned NaN or infinite logits'),
    # XLA:CPU's vectorized max drops a NaN among finite logits: the check sums them too.
    **{f'inf_column_{mode}_kernels_{switch}': (
        ["--gin.TARGET_CHECKPOINT='{d}/inf_column'", *flags],
        'input line(s) 1, 2: a model returned NaN or infinite logits')
       for mode, flags in (('greedy', []), ('sampled', ['--gin.TEMPERATURE=1.0']),
                           ('beam', ["--gin.DECODE='beam'"]))
       for switch in ('0', '1')},
    # The corrupt checkpoint shows the output is checked before any model is loaded.
    'missing_output_directory': (["--gin.OUTPUT_FILE='{d}/missing/out.jsonl'",
                                  "--gin.TARGET_CHECKPOINT='{d}/corrupt'"],
                                 'the directory {d}/missing does not exist'),
    'output_under_a_file': (["--gin.OUTPUT_FILE='{d}/inputs.txt/out.jsonl'"],
                            'output file {d}/inputs.txt/out.jsonl: cannot write'),
    'output_is_input': (["--gin.OUTPUT_FILE='{d}/inputs.txt'"],
                        'output file {d}/inputs.txt is the input file'),
    'not_utf8': (["--gin.INPUT_FILE='{d}/latin1.txt'"],
                 '{d}/latin1.txt line 2: not UTF-8 text (byte 0xe9 at column 6)'),
    'not_sentencepiece': (["--gin.VOCABULARY_FILE='{d}/not_sentencepiece.model'"],
                          'vocabulary file {d}/not_sentencepiece.model: not a SentencePiece model'),
    'quoted_number': (["--gin.TEMPERATURE='0.7'"],
                      "temperature (TEMPERATURE in gin) must be a number, got '0.7' (str): "
                      'numbers take no quotes'),
    'float_seed': (['--gin.SEED=1.5'], 'seed (SEED in gin) must be an integer, got 1.5'),
    'float_gamma': (['--gin.GAMMA=2.0'], 'gamma (GAMMA in gin) must be an integer, got 2.0'),
    'unknown_verification': (["--gin.VERIFICATION='tree'"],
                             "verification must be one of ('token', 'block'), got 'tree' "
                             '(MAX_DECODE_LEN, GAMMA, VERIFICATION, VERIFY_LENGTHS in gin)'),
    'threshold_above_1': (['--gin.CONFIDENCE_THRESHOLD=1.5'],
                          'confidence_threshold (CONFIDENCE_THRESHOLD in gin) must be None or in '
                          '[0, 1], got 1.5'),
    'verify_lengths_without_threshold': (['--gin.VERIFY_LENGTHS=[2, 3]'],
                                         'verify_lengths (VERIFY_LENGTHS in gin) only shortens'),
    'verify_length_too_long': (['--gin.CONFIDENCE_THRESHOLD=0.4', '--gin.VERIFY_LENGTHS=[2, 9]'],
                               'verify_lengths must be integers in 2..gamma + 1 = 5, got [2, 9] '
                               '(MAX_DECODE_LEN, GAMMA, VERIFICATION, VERIFY_LENGTHS in gin)'),
    'unknown_decode': (["--gin.DECODE='nucleus'"],
                       "decode (DECODE in gin) must be 'sample' or 'beam', got 'nucleus'"),
    'beam_with_temperature': (["--gin.DECODE='beam'", '--gin.TEMPERATURE=0.7'],
                              "temperature (TEMPERATURE in gin) does not apply to DECODE='beam'"),
    'beam_nan_logits': (["--gin.DECODE='beam'", "--gin.TARGET_CHECKPOINT='{d}/nan'"],
                        'input line(s) 1, 2: a model returned NaN or infinite logits'),
    'output_fields_in_input': (["--gin.INPUT_FILE='{d}/fields.jsonl'"],
                               "line 1: the input field(s) 'line', 'batch' would be overwritten"),
    'beam_fields_in_input': (["--gin.DECODE='beam'", "--gin.INPUT_FILE='{d}/beam_fields.jsonl'"],
                             "line 1: the input field(s) 'score', 'beams' would be overwritten"),
    # Input files: a blank line, a JSON line that does not parse, nothing but a byte order mark.
    'blank_line': (["--gin.INPUT_FILE='{d}/blank.txt'"],
                   '{d}/blank.txt line 2: a blank line (every line is one input): remove it'),
    'broken_json_line': (["--gin.INPUT_FILE='{d}/broken.jsonl'"],
                         '{d}/broken.jsonl line 2: not valid JSON (Expecting property name '
                         'enclosed in double quotes at column 21)'),
    # SentencePiece drops zero-width spaces: the line would decode from EOS alone.
    'invisible_line': (["--gin.INPUT_FILE='{d}/invisible.txt'"],
                       "{d}/invisible.txt line 2: the input '\\u200b\\u200b\\u200b' is no token of "
                       'the vocabulary (only spaces or invisible characters)'),
    'lone_surrogate': (["--gin.INPUT_FILE='{d}/surrogate.jsonl'"],
                       '{d}/surrogate.jsonl line 2: field "inputs" holds a lone UTF-16 surrogate '
                       "'\\ud800' at character 3"),
    # Settings that would read an unknown value as a default, or fail naming nothing.
    'kernels_switch_unknown': ([], "SPEC_DECODE_CPU_KERNELS='disabled': set it to 0 (XLA's "
                                   'products and attention) or 1'),
    'vocabulary_file_none': (['--gin.VOCABULARY_FILE=None'],
                             "sentencepiece_model_file (VOCABULARY_FILE in the command line's gin "
                             'files) must be the path of a SentencePiece model, got None'),
    'empty_input_file': (["--gin.INPUT_FILE='{d}/empty.txt'"],
                         'input file {d}/empty.txt is empty: it needs one input per line'),
    # Memory: caches of 16 TB fail before compiling, naming the settings and the limit.
    'absurd_max_decode_len': (['--gin.MAX_DECODE_LEN=1000000000'],
                              'MAX_DECODE_LEN and BATCH_SIZE (with BEAM_SIZE, GAMMA, the models and '
                              'the longest input) need at least 1.64e+04 GB'),
    'memory_limit_too_low': (['--gin.MEMORY_LIMIT_GB=0.001'],
                             'but MEMORY_LIMIT_GB is 0.001 GB: lower MAX_DECODE_LEN or BATCH_SIZE'),
    'memory_limit_quoted': (["--gin.MEMORY_LIMIT_GB='0.5'"],
                            'memory_limit_gb (MEMORY_LIMIT_GB in gin) must be a number '
                            "or None, got '0.5' (str): numbers take no quotes"),
    # Beam settings: BEAM_ALPHA in [0, 10] (1e999 is gin's inf), sizes whose rows fit int32.
    'beam_alpha_inf': (["--gin.DECODE='beam'", '--gin.BEAM_ALPHA=1e999'],
                       'beam_alpha (BEAM_ALPHA in gin): alpha must be a finite number in [0, 10] '
                       '(the brevity penalty exponent; T5X uses 0.6), got inf'),
    'beam_alpha_negative': (["--gin.DECODE='beam'", '--gin.BEAM_ALPHA=-0.5'],
                            'beam_alpha (BEAM_ALPHA in gin): alpha must be a finite number in '
                            '[0, 10]'),
    'beam_alpha_huge': (["--gin.DECODE='beam'", '--gin.BEAM_ALPHA=1e6'],
                        'beam_alpha (BEAM_ALPHA in gin): alpha must be a finite number in '
                        '[0, 10] (the brevity penalty exponent; T5X uses 0.6), got 1000000.0'),
    'beam_size_zero': (["--gin.DECODE='beam'", '--gin.BEAM_SIZE=0'],
                       'beam_size (BEAM_SIZE in gin) must be an integer in 1..2147483647'),
    'draft_width_over_vocabulary': (["--gin.DECODE='beam'", '--gin.DRAFT_WIDTH=9000'],
                                    'draft_width must be an integer >= 1 and <= 8192, got 9000 '
                                    '(BEAM_SIZE, DRAFT_WIDTH, BATCH_SIZE in gin)'),
    'beam_rows_overflow': (["--gin.DECODE='beam'", '--gin.BATCH_SIZE=65536',
                            '--gin.BEAM_SIZE=65536', '--gin.DRAFT_WIDTH=1'],
                           'beam_size=65536 * draft_width=1 * batch=65536 = 4294967296 rows exceed '
                           'int32 (2147483647) (BEAM_SIZE, DRAFT_WIDTH, BATCH_SIZE in gin)'),
    # Integers that would wrap on the device (int32) or in jax.random.key (32 bits).
    'top_k_beyond_int32': (['--gin.TOP_K=2147483648'],
                           'top_k (TOP_K in gin) must be an integer in 0..2147483647 (0 disables; '
                           'int32 on the device), got 2147483648'),
    'seed_beyond_64_bits': (['--gin.SEED=18446744073709551616'],
                            'seed (SEED in gin) must be an integer in 0..4294967295'),
    'seed_beyond_32_bits': (['--gin.SEED=4294967296'],
                            'seed (SEED in gin) must be an integer in 0..4294967295 (jax keys '
                            'keep 32 bits of a seed: a larger one repeats a smaller one), got '
                            '4294967296'),
    'negative_seed': (['--gin.SEED=-1'], 'seed (SEED in gin) must be an integer in 0..4294967295'),
    'max_decode_len_beyond_int32': (['--gin.MAX_DECODE_LEN=2147483648'],
                                    'max_decode_len (MAX_DECODE_LEN in gin) must be an integer in '
                                    '1..2147483647 (int32 on the device), got 2147483648'),
    'batch_size_zero': (['--gin.BATCH_SIZE=0'],
                        'batch_size (BATCH_SIZE in gin) must be an integer in 1..2147483647'),
    'batch_size_beyond_int32': (['--gin.BATCH_SIZE=2147483648'],
                                'batch_size (BATCH_SIZE in gin) must be an integer in '
                                '1..2147483647'),
    'gamma_beyond_int32': (['--gin.GAMMA=4294967297'],
                           'gamma (GAMMA in gin) must be an integer in 1..2147483647'),
    'decode_len_plus_gamma_beyond_int32': (['--gin.MAX_DECODE_LEN=2147483647'],
                                           'max_decode_len + gamma + 2 must be at most 2147483647'),
    'processes_without_a_mesh': ([_PROCESSES, "--gin.COORDINATOR_ADDRESS='localhost:1234'",
                                  '--gin.NUM_PROCESSES=2'],
                                 'a run over several processes needs a mesh: set MODEL_PARALLEL'),
    'processes_without_a_coordinator': ([_PROCESSES, '--gin.NUM_PROCESSES=2'],
                                        'NUM_PROCESSES and PROCESS_ID need a COORDINATOR_ADDRESS'),
    'coordinator_without_a_port': ([_PROCESSES, "--gin.COORDINATOR_ADDRESS='localhost'",
                                    '--gin.NUM_PROCESSES=2'],
                                   'joining the other processes: coordinator_address must be '
                                   "host:port (port 1..65534; the next port is used too), got "
                                   "'localhost'"),
    'process_id_not_below_the_count': ([_PROCESSES, '--gin.NUM_PROCESSES=2', '--gin.PROCESS_ID=2'],
                                       'process_id 2 (PROCESS_ID in gin) must be below '
                                       'num_processes 2 (NUM_PROCESSES)'),
    # The command line's beam search runs in one process (the library's takes a mesh).
    'beam_over_processes': ([_PROCESSES, "--gin.COORDINATOR_ADDRESS='localhost:1234'",
                             '--gin.NUM_PROCESSES=2', "--gin.DECODE='beam'"],
                            "DECODE='beam' decodes in one process, on one device: the command "
                            'line does not run beam search over several processes'),
    'heartbeat_timeout_zero': ([_PROCESSES, '--gin.HEARTBEAT_TIMEOUT_S=0'],
                               'heartbeat_timeout_s (HEARTBEAT_TIMEOUT_S in gin) must be a number '
                               'of seconds >= 1, got 0'),
}


# Runs that must succeed (decode.gin, in the checkpoints' folder): the same target as a T5X
# checkpoint and as an orbax one given by a relative path (orbax itself refuses relative paths).
RUNS = {
    't5x_absolute': ["--gin.TARGET_CHECKPOINT='{d}/target'", "--gin.DRAFT_CHECKPOINT='{d}/target'"],
    'orbax_relative': ["--gin.TARGET_CHECKPOINT='orbax_target'",
                       "--gin.DRAFT_CHECKPOINT='./orbax_target/'"],
}


# The environment of the cases that set it (each traces anew, so the kernels' switch applies).
ENVIRONMENTS = {
    **{name: {'SPEC_DECODE_CPU_KERNELS': name[-1]} for name in CASES if '_kernels_' in name},
    'kernels_switch_unknown': {'SPEC_DECODE_CPU_KERNELS': 'disabled'},
}


# Runs over baseline.gin in batches of 1: interrupted by a real signal after two
# records, or failing midway when the output may not grow past 2 KiB.
STOPPED = {
    'sigint': (signal.SIGINT, 'interrupted by SIGINT: {out} was not written; the first '),
    'sigterm': (signal.SIGTERM, 'interrupted by SIGTERM: {out} was not written; the first '),
    'full_disk': (None, 'writing {out}: [Errno 27] File too large; {out} was not written; the '
                        'first '),
}


def _stopped_case(files, name: str) -> dict:
  signum, _ = STOPPED[name]
  out = files / f'{name}.jsonl'
  out.write_text('{"output": "of an earlier run"}\n')  # removed when the run starts
  inputs = files / ('many.txt' if signum else 'twenty.txt')
  case = {'flags': [f'--gin_file={files / "baseline.gin"}', '--gin.BATCH_SIZE=1',
                    f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_FILE='{out}'"]}
  if signum:
    case['signal'] = [int(signum), f'{out}.incomplete', 2]
  else:
    case['max_file_bytes'] = 2048
  return case


@pytest.fixture(scope='module')
def results(files, tmp_path_factory):
  cases = {name: {'flags': [f'--gin_file={files / "decode.gin"}',
                            *(f.format(d=files) for f in flags)],
                  'env': ENVIRONMENTS.get(name, {})}
           for name, (flags, _) in CASES.items()}
  cases.update({name: _stopped_case(files, name) for name in STOPPED})
  cases.update({name: {'flags': [f'--gin_file={files / "decode.gin"}',
                                 f"--gin.OUTPUT_FILE='{files / name}.jsonl'",
                                 *(f.format(d=files) for f in flags)]}
                for name, flags in RUNS.items()})
  path = tmp_path_factory.mktemp('driver') / 'cases.json'
  path.write_text(json.dumps(cases))
  run = subprocess.run([sys.executable, str(TESTS / 'cli_driver.py'), str(path)],
                       capture_output=True, text=True, timeout=600, cwd=files)
  assert run.returncode == 0, run.stderr
  return json.loads(run.stdout)


def _error_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.startswith('error: ')]


@pytest.mark.parametrize('name', CASES)
def test_bad_input_exits_1_naming_the_problem(name, files, results):
  result = results[name]
  assert result['rc'] == 1, result['stderr']
  message = CASES[name][1].format(d=files)
  assert any(message in line for line in _error_lines(result['stderr'])), result['stderr']
  assert 'Traceback' not in result['stderr']
  assert not (files / 'out.jsonl').exists() and not (files / 'out.jsonl.incomplete').exists()


@pytest.mark.parametrize('name', STOPPED)
def test_stopped_run_leaves_no_output_and_says_what_it_wrote(name, files, results):
  signum, message = STOPPED[name]
  out, total = files / f'{name}.jsonl', 300 if signum else 20
  result = results[name]
  assert result['rc'] == (128 + signum if signum else 1), result['stderr']
  [line] = _error_lines(result['stderr'])
  assert line.startswith('error: ' + message.format(out=out)), line
  written = pathlib.Path(f'{out}.incomplete').read_text()
  records = written.count('\n')
  assert f'the first {records} of {total} records (the last line possibly cut) are in ' in line
  assert 2 <= records < total and not out.exists()
  assert f"note: removed {out}, an earlier run's output" in result['stderr']
  assert [json.loads(r)['line'] for r in written.splitlines()[:2]] == [1, 2]



def test_an_orbax_checkpoint_given_by_a_relative_path_decodes_as_its_t5x_copy(files, results):
  for name in RUNS:
    assert results[name]['rc'] == 0, results[name]['stderr']
  records = {name: [json.loads(line) for line in (files / f'{name}.jsonl').read_text().splitlines()]
             for name in RUNS}
  assert [r['output_ids'] for r in records['orbax_relative']] == [
      r['output_ids'] for r in records['t5x_absolute']]
  assert len(records['t5x_absolute']) == 2


@pytest.mark.parametrize('alpha', [float('nan'), float('inf'), -0.1, 10.5])
def test_check_beam_refuses_alpha_outside_0_to_10(alpha):
  # NaN has no gin literal: checked here, where the command line's values arrive.
  with pytest.raises(ConfigError, match=rf'beam_alpha \(BEAM_ALPHA in gin\): alpha must be a '
                                        rf'finite number in \[0, 10\] .*, got {alpha}'):
    settings.check_beam(decode='beam', beam_size=4, beam_alpha=alpha, draft_width=4,
                        batch_size=8, vocab_size=100, speculate=True)
  settings.check_beam(decode='beam', beam_size=4, beam_alpha=10.0, draft_width=4, batch_size=8,
                      vocab_size=100, speculate=True)


def test_allow_vocabulary_mismatch_warns_and_goes_on(files):
  paths = {'target': str(files / 'target'), 'draft': str(files / 'other_vocabulary')}
  configs = {name: t5_1_1('tiny', vocab_size=8192) for name in paths}
  vocabulary = text.Vocabulary(data.VOCAB_PATH)
  with pytest.raises(ConfigError, match='vocabulary mismatch'):
    settings.check_recorded_vocabularies(vocabulary, paths, configs, allow_mismatch=False)
  with pytest.warns(UserWarning, match='vocabulary mismatch'):
    settings.check_recorded_vocabularies(vocabulary, paths, configs, allow_mismatch=True)
