"""Real Megatron-LM launch scripts as users keep them (tests/data/real-configs/megatron, MANIFEST.yaml
names each file's source and the reading it must give): none crashes, none is misread, at most one in
ten is refused though simpar could model it, and every refusal is one line naming the argument or
construct and the fix. The files a launch reads beside itself (the sc21 scripts' CONFIG.sh, SBATCH.sh
and SRUN.sh: MANIFEST's ``support`` entries) are laid out as in their repository, so each script finds
them. Beside them: the bash subset the launch reader interprets (sourcing files and sbatch's job script
included), Megatron's vocabulary padding, the argument table, and the launch `--emit megatron` writes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from simpar.sim.errors import SpecError
from simpar.sim.interop.emit import megatron_launch
from simpar.sim.interop.megatron import read_megatron
from simpar.sim.interop.megatron_args import MODEL_INTS, PLAN_INTS
from simpar.sim.interop.megatron_known import ARGUMENTS
from simpar.sim.interop.megatron_moe import MLA_INTS, MOE_INTS
from simpar.sim.interop.megatron_script import read_script
from simpar.sim.plan import ParallelPlan
from simpar.sim.specs import load_model

DATA = Path(__file__).parent / "data" / "real-configs" / "megatron"
MANIFEST = yaml.safe_load((DATA / "MANIFEST.yaml").read_text())["files"]
LAUNCHES = [e for e in MANIFEST if "support" not in e]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> dict[str, Path]:
    """Every corpus file at its repository path under its commit (``<commit>/examples/sc21/SRUN.sh``),
    so that a launch finds the files it sources beside it, as in the user's checkout."""
    root = tmp_path_factory.mktemp("megatron-lm")
    out: dict[str, Path] = {}
    for e in MANIFEST:
        dest = root / e["commit"] / e["path"]
        assert not dest.exists(), dest  # one file per commit and path
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(DATA / e["file"], dest)
        out[e["file"]] = dest
    return out


def _reading(path: Path) -> dict | SpecError:
    try:
        imp = read_megatron(str(path))
    except SpecError as e:
        return e
    p, m = imp.plan, imp.model
    return {
        "gpus": imp.gpus,
        "tp": p.get("tp", 1),
        "pp": p.get("pp", 1),
        "cp": p.get("cp", 1),
        "vpp": p.get("vpp", 1),
        "mbs": p.get("micro_batch_size"),
        "gbs": p.get("global_batch_size"),
        "precision": p["precision"],
        "recompute": p["recompute"],
        "zero": p["zero"],
        "sequence_parallel": p["sequence_parallel"],
        "layers": m["layers"],
        "hidden": m["hidden"],
        "heads": m["heads"],
        "kv_heads": m.get("kv_heads", m["heads"]),
        "ffn": m.get("ffn", 4 * m["hidden"]),
        "seq_len": m["seq_len"],
        "vocab": m["vocab"],
        "arch": m["arch"],
        "moe_experts": (m.get("moe") or {}).get("experts", 0),
    }


def test_every_real_launch_reads_as_its_manifest_says(tree):
    assert len(LAUNCHES) >= 40 and {e["file"] for e in MANIFEST} == {p.name for p in DATA.glob("*.sh")}
    misread, refused_modelable, read = [], [], 0
    for e in LAUNCHES:
        got = _reading(tree[e["file"]])  # a crash (any other exception) fails the test here
        if isinstance(got, SpecError):
            line = str(got)
            assert "\n" not in line and " Fix: " in line, line
            if "refused" not in e or not got.field.endswith(e["refused"]):
                misread.append((e["file"], line))
            if e.get("modelable"):
                refused_modelable.append(e["file"])
        elif got != e.get("expect"):
            misread.append((e["file"], got))
        else:
            read += 1
    assert not misread, misread
    assert len(refused_modelable) * 10 <= len(LAUNCHES), refused_modelable
    assert read >= 10


def test_the_sc21_scripts_read_through_the_files_they_source(tree):
    """run_figure_11.sh sets PP=1, GBS=8, NLS=3*PP, TP=8, MBS=1, HS=20480, NAH=128, then sources CONFIG.sh
    (MEGATRON_PARAMS) and SBATCH.sh, whose sbatch submits SRUN.sh with --export=...,MEGATRON_PARAMS,...
    and srun runs sh -c "${CMD}"; kept without its siblings, it is refused naming the one it misses."""
    imp = read_megatron(str(tree["mlm-v2_5-sc21-run_figure_11.sh"]))
    p, m = imp.plan, imp.model
    assert (p["tp"], p["pp"], p["global_batch_size"], p["micro_batch_size"]) == (8, 1, 8, 1)
    assert (m["layers"], m["hidden"], m["heads"], m["seq_len"], p["recompute"]) == (3, 20480, 128, 2048, "full")
    assert "its job script SRUN.sh read with DOCKER_MOUNT_DIR, MEGATRON_CODE_DIR, MEGATRON_PARAMS" in imp.warning()
    with pytest.raises(SpecError) as e:
        read_megatron(str(DATA / "mlm-v2_5-sc21-run_figure_11.sh"))
    assert e.value.field.endswith("line 36: . CONFIG.sh") and "put CONFIG.sh next to the script" in str(e.value)


def test_published_readings_hold_known_facts():
    """Facts checked against the files by hand: GPT-3 175B's tp 8 x pp 16 and its vocabulary, GPT-2's
    50,257 tokens padded to 128 x tp."""
    e = {x["file"]: x for x in MANIFEST}
    gpt3 = e["mlm-core_v0_8_0-gpt3-train_gpt3_175b_distributed.sh"]["expect"]
    assert (gpt3["tp"], gpt3["pp"], gpt3["layers"], gpt3["hidden"], gpt3["vocab"]) == (8, 16, 96, 12288, 51200)
    mp = e["mlm-v2_0-pretrain_gpt_distributed_with_mp.sh"]["expect"]
    assert (mp["tp"], mp["pp"], mp["vocab"], mp["recompute"], mp["gpus"]) == (2, 2, 50432, "full", 8)


SCRIPT = r"""#!/bin/bash
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
NNODES=${SLURM_NNODES:-"2"}
TP=${TP:-4}
PP=2
CKPT=$1            # a positional parameter: unknown, fine for --save
WORLD=$(($GPUS_PER_NODE*$NNODES))
MODEL_ARGS=(
    --num-layers 8   # a comment inside the array
    --hidden-size 256 --num-attention-heads 8
    --seq-length 512 --max-position-embeddings 512
)
MODEL_ARGS+=(--vocab-size 1000 --tokenizer-type NullTokenizer)
if [[ "$PP" == "2" ]] && [ -n "$TP" ]; then
    PAR="--tensor-model-parallel-size $TP --pipeline-model-parallel-size ${PP}"
else
    PAR="--tensor-model-parallel-size 1"
fi
if [ -f /etc/some-file ]; then
    EXTRA=--nothing-real
fi
for i in 1 2; do
    echo "$i"
done
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes "$NNODES" \
    pretrain_gpt.py "${MODEL_ARGS[@]}" $PAR --micro-batch-size 1 --global-batch-size 16 \
    --save "$CKPT" --bf16 2>&1 | tee log.txt
"""


def test_the_bash_subset_reads_as_bash_would():
    s = read_script(SCRIPT, "w")
    assert s.line == 26 and s.launcher == ["torchrun", "--nproc_per_node", "8", "--nnodes", "2"]
    assert s.args[:4] == ["--num-layers", "8", "--hidden-size", "256"]
    assert "--tensor-model-parallel-size" in s.args and s.args[s.args.index("--tensor-model-parallel-size") + 1] == "4"
    assert s.unknown_in(s.args[s.args.index("--save") + 1]).startswith("$1")
    imp = read_megatron(SCRIPT)
    assert imp.gpus == 16 and (imp.plan["tp"], imp.plan["pp"]) == (4, 2)
    assert imp.model["vocab"] == 1024  # 1000 padded to 128 x tp 4 = 512: 1024
    assert "$SLURM_NNODES unset" in imp.warning()


@pytest.mark.parametrize(
    ("script", "named"),
    [
        ("for x in 1; do\n torchrun pretrain_gpt.py --bf16\ndone\n", "line 2: for loop"),
        ("if [ -f x ]; then\n torchrun pretrain_gpt.py --bf16\nfi\n", "line 2: if"),
        ("source env.sh\ntorchrun pretrain_gpt.py --bf16\n", "line 1: source"),
        ("cat <<EOF\nx\nEOF\n", "line 1: here-document"),
        ("torchrun pretrain_gpt.py --bf16\ntorchrun pretrain_gpt.py --fp16\n", "line 2"),
        ("echo hi\n", "Megatron-LM arguments"),
        ("A='x\n", "line 1: quote"),
        ("torchrun pretrain_gpt.py $EXTRA --bf16\n", "$EXTRA"),
        ("if [ -f x ]; then TP=2; fi\ntorchrun pretrain_gpt.py --tensor-model-parallel-size $TP\n", "parallel-size"),
        ("torchrun pretrain_bert.py --bf16\n", "pretrain_bert.py"),
        ("python my_train.py --bf16\n", "my_train.py"),
    ],
)
def test_unsupported_constructs_are_refused_by_name_and_line(script, named):
    with pytest.raises(SpecError) as e:
        read_megatron(script)
    assert named in e.value.field and "\n" not in str(e.value) and " Fix: " in str(e.value), str(e.value)


def test_a_while_loop_that_never_runs_and_an_undecidable_if_are_skipped():
    text = (
        "TP=2\nwhile [[ $# -gt 0 ]]; do\n TP=8\n shift\ndone\n"
        "if [ -f /x ]; then\n LOG=1\nfi\n"
        "torchrun --nproc_per_node 2 pretrain_gpt.py --tensor-model-parallel-size $TP --global-batch-size 4\n"
    )
    assert read_megatron(text).plan["tp"] == 2


_LAUNCH = (
    "torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size $TP --num-layers 4 --hidden-size 256 "
    "--num-attention-heads 8 --seq-length 512 --max-position-embeddings 512 --global-batch-size 16\n"
)


def _files(folder: Path, **texts: str) -> Path:
    """Write each ``name=text`` into ``folder`` (``_`` in a name for ``.``); the path of ``run.sh``."""
    for name, text in texts.items():
        (folder / name.replace("_", ".")).write_text(text)
    return folder / "run.sh"


def test_a_sourced_files_assignments_are_seen_after_it(tmp_path):
    run = _files(
        tmp_path,
        env_sh="LAYERS=$BASE\nTP=4\nsource more.sh\n",  # sees the script's variables, and sources one more
        more_sh='if [ "$TP" == 4 ]; then\n PP=2\nfi\n',
        run_sh="BASE=4\nsource env.sh\n" + _LAUNCH.replace("$TP", "$TP --pipeline-model-parallel-size $PP"),
    )
    imp = read_megatron(str(run))
    assert (imp.plan["tp"], imp.plan["pp"], imp.gpus) == (4, 2, 8)
    assert any("files read relative to the script's folder" in n for n in imp.unmodelled)


def test_a_launch_in_a_sourced_file_is_named_by_its_file_and_line(tmp_path):
    run = _files(tmp_path, launch_sh="TP=2\ntorchrun pretrain_bert.py --bf16\n", run_sh=". ./launch.sh\n")
    with pytest.raises(SpecError) as e:
        read_megatron(str(run))
    assert e.value.field == "Megatron-LM arguments launch.sh line 2: pretrain_bert.py"


@pytest.mark.parametrize(
    ("texts", "field", "words"),
    [
        ({"run_sh": "source CONFIG.sh\n" + _LAUNCH}, "line 1: source CONFIG.sh", "put CONFIG.sh next to the script"),
        ({"run_sh": "TP=2\nsource a.sh 1 2\n" + _LAUNCH, "a_sh": ""}, "line 2: source with arguments", "1 2"),
        (
            {"run_sh": "source a.sh\n", "a_sh": ". b.sh\n", "b_sh": "source a.sh\n"},
            "b.sh line 1: source a.sh",
            "a.sh -> b.sh -> a.sh",
        ),
        ({"run_sh": "source run.sh\n"}, "line 1: source run.sh", "run.sh -> run.sh"),
        ({"run_sh": 'source "$(dirname "$0")/env.sh"\n'}, "line 1: source", "own location"),
        ({"run_sh": "source ${BASH_SOURCE%/*}/env.sh\n"}, "line 1: source", "own location"),
        ({"run_sh": "source $CONF\n"}, "line 1: source", "$CONF"),
        ({"run_sh": "source\n"}, "line 1: source", "names no file"),
        ({"run_sh": "sbatch --wrap 'python pretrain_gpt.py' \n"}, "line 1: sbatch --wrap", "command line"),
        ({"run_sh": "sbatch -N 2 job.sh 4\n", "job_sh": ""}, "line 1: sbatch job.sh with arguments", "4"),
        ({"run_sh": "sbatch -N 2\n"}, "line 1: sbatch", "standard input"),
        ({"run_sh": "sbatch -D /x job.sh\n"}, "line 1: sbatch --chdir", "another folder"),
    ],
)
def test_files_simpar_cannot_follow_are_refused_by_name(tmp_path, texts, field, words):
    with pytest.raises(SpecError) as e:
        read_megatron(str(_files(tmp_path, **texts)))
    assert e.value.field.endswith(field) and words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_sources_nest_eight_deep_and_no_deeper(tmp_path):
    for n in range(1, 9):  # run.sh -> l1.sh -> ... -> l8.sh: eight files read one inside another
        (tmp_path / f"l{n}.sh").write_text(f"source l{n + 1}.sh\n" if n < 8 else "TP=2\n")
    assert read_megatron(str(_files(tmp_path, run_sh="source l1.sh\n" + _LAUNCH))).plan["tp"] == 2
    (tmp_path / "l8.sh").write_text("source l9.sh\n")
    (tmp_path / "l9.sh").write_text("TP=2\n")
    with pytest.raises(SpecError) as e:
        read_megatron(str(tmp_path / "run.sh"))
    assert e.value.field.endswith("l8.sh line 1: source l9.sh") and "simpar follows 8" in str(e.value)


def test_a_job_sees_what_sbatch_exports_to_it(tmp_path):
    job = 'srun sh -c "python pretrain_gpt.py $ARGS --tensor-model-parallel-size ${TP:-1}"\n'
    base = "ARGS='--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512'\nTP=4\n"
    for submit, tp in [
        ("export ARGS TP\nsbatch job.sh\n", 4),  # --export=ALL (the default): the exported variables
        ("export ARGS\nsbatch job.sh\n", 1),  # TP not exported: the job's ${TP:-1}
        ("export ARGS TP\nsbatch --export=ARGS -p x job.sh\n", 1),  # only ARGS
        ("export ARGS\nsbatch --export=ARGS,TP=2 job.sh\n", 2),
        ("set -a\n" + base + "set +a\nsbatch job.sh\n", 4),
        ("export ARGS\nsbatch job.sh\nexport TP=8\n", 1),  # what the script sets after sbatch is not the job's
    ]:
        imp = read_megatron(str(_files(tmp_path, job_sh=job, run_sh=base + submit)))
        assert imp.plan.get("tp", 1) == tp, submit
    with pytest.raises(SpecError, match="ARGS"):
        read_megatron(str(_files(tmp_path, job_sh=job, run_sh=base + "sbatch --export=NONE job.sh\n")))
    # the job script's own #SBATCH lines (before its first command) count, the command line's first
    own = "#!/bin/bash\n#SBATCH -N 2 --export=ARGS # a comment\n\n" + job
    submit = base + "export ARGS TP\nsbatch job.sh\n"
    assert read_megatron(str(_files(tmp_path, job_sh=own, run_sh=submit))).plan.get("tp", 1) == 1
    submit = base + "export ARGS TP\nsbatch --export=ALL job.sh\n"
    assert read_megatron(str(_files(tmp_path, job_sh=own, run_sh=submit))).plan["tp"] == 4
    with pytest.raises(SpecError) as e:
        read_megatron(str(_files(tmp_path, job_sh="#SBATCH --chdir=/x\n" + job, run_sh=submit)))
    assert e.value.field == "Megatron-LM arguments job.sh #SBATCH lines: sbatch --chdir", str(e.value)


@pytest.mark.parametrize(
    ("flags", "vocab"),
    [
        ("", 50304),  # pretrain_gpt.py's GPT2BPETokenizer: 50,257 padded to 128
        ("--tensor-model-parallel-size 8", 51200),  # padded to 1024
        ("--make-vocab-size-divisible-by 1", 50257),
        ("--tokenizer-type NullTokenizer --vocab-size 32000", 32000),
        ("--tokenizer-type NullTokenizer --vocab-size 32000 --legacy-tokenizer", 32128),
        ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model m --vocab-size 128256", 128256),
        ("--padded-vocab-size 1000", 1000),
    ],
)
def test_the_vocabulary_is_the_tokenizers_padded_as_megatron_pads_it(flags, vocab):
    base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
    assert read_megatron(base + flags).model["vocab"] == vocab


def test_a_tokenizer_file_without_its_size_is_refused_by_name():
    base = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
    with pytest.raises(SpecError, match="add --vocab-size") as e:
        read_megatron(base + "--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Llama-3-8B")
    assert e.value.field.endswith("--tokenizer-type HuggingFaceTokenizer")
    assert read_megatron(base + "--tokenizer-type HuggingFaceTokenizer", model_given=True).model == {}


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ("--context-parallel-size 4 --cp-comm-type a2a+p2p", "--cp-comm-type a2a+p2p"),
        ("--context-parallel-size 2 --cp-comm-type p2p a2a", "--cp-comm-type"),
        ("--context-parallel-size 2 --cp-comm-type ring", "--cp-comm-type ring"),
        (
            "--context-parallel-size 2 --hierarchical-context-parallel-sizes 2 1",
            "--hierarchical-context-parallel-sizes",
        ),
        (
            "--context-parallel-size 8 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2",
            "--hierarchical-context-parallel-sizes",
        ),
        (
            "--context-parallel-size 8 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2 2",
            "--hierarchical-context-parallel-sizes",
        ),
        ("--fp8-param-gather", "--fp8-param-gather"),
        ("--attention-backend unfused", "--attention-backend"),
        ("--frobnicate 3", "--frobnicate"),
        ("--virtual-pipeline-model-parallel-size 2", "--virtual-pipeline-model-parallel-size"),
    ],
)
def test_refused_and_unknown_arguments_stop_naming_the_flag(flags, field):
    with pytest.raises(SpecError) as e:
        read_megatron("--tensor-model-parallel-size 1 " + flags)
    assert e.value.field.endswith(field), str(e.value)


@pytest.mark.parametrize("kind", ["p2p", "all_gather", "a2a"])
def test_context_parallel_communication_types_read_into_the_plan(kind):
    imp = read_megatron(f"--context-parallel-size 2 --cp-comm-type {kind}")
    assert imp.plan["cp"] == 2 and imp.plan["cp_comm_type"] == kind


def test_hierarchical_context_parallelism_reads_its_all_to_all_size():
    imp = read_megatron("--context-parallel-size 8 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 4")
    assert (imp.plan["cp"], imp.plan["cp_comm_type"], imp.plan["cp_a2a_size"]) == (8, "a2a+p2p", 2)


def test_p2p_context_parallelism_reads_and_harmless_flags_share_one_warning():
    imp = read_megatron(
        "--context-parallel-size 2 --cp-comm-type p2p --lr 1e-4 --log-interval 1 --use-flash-attn --seed 3"
    )
    assert imp.plan["cp"] == 2
    w = imp.warning()
    assert w.count("warning:") == 1 and all(k in w for k in ("--lr", "--log-interval", "--use-flash-attn", "--seed"))


def test_architecture_spellings_read():
    base = (
        "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --tokenizer-type NullTokenizer "
        "--vocab-size 256 --normalization RMSNorm --disable-bias-linear --attention-dropout 0 --hidden-dropout 0 "
    )
    old = read_megatron(base + "--swiglu --use-rotary-position-embeddings --untie-embeddings-and-output-weights")
    assert (old.model["arch"], old.model["tie_embeddings"]) == ("llama", False)
    oss = read_megatron(
        base + "--quick-geglu --position-embedding-type rope --window-size 127,0 --window-attn-skip-freq 2 "
        "--softmax-type learnable --glu-linear-offset 1.0 --activation-func-clamp-value 7.0"
    )
    assert (oss.model["window"], oss.model["full_attention_every"], oss.model["attention_sinks"]) == (128, 2, True)
    legacy = read_megatron(
        base.replace("RMSNorm", "LayerNorm").replace("--disable-bias-linear ", "").replace("--hidden-dropout 0", "")
        + "--recompute-activations"
    )
    assert (legacy.model["arch"], legacy.plan["recompute"]) == ("gpt", "selective")


def test_every_argument_simpar_reads_is_one_megatron_takes():
    modelled = {k for k, (_, v) in ARGUMENTS.items() if v == "modelled"}
    ints = {*PLAN_INTS, *MODEL_INTS, *MOE_INTS, *MLA_INTS} - {"--virtual-pipeline-model-parallel-size"}
    assert ints <= modelled
    assert all(v in ("harmless", "modelled") or v.startswith("refused: ") for _, v in ARGUMENTS.values())
    assert all(a in ("s", "v", "l", "o") for a, _ in ARGUMENTS.values()) and len(ARGUMENTS) > 900


def test_the_emitted_launch_is_a_complete_script_that_reads_back():
    model = load_model("llama3-8b")
    plan = ParallelPlan(tp=2, pp=2, dp=2, vpp=2, global_batch_size=16, schedule="interleaved-1f1b", zero=1)
    text = megatron_launch(plan, model, 8, 8)
    assert text.startswith("#!/bin/bash") and 'DATA_PATH="${DATA_PATH:?' in text and "torchrun" in text
    assert "--num-virtual-stages-per-pipeline-rank 2" in text and "--tokenizer-type NullTokenizer" in text
    imp = read_megatron(text)
    assert ParallelPlan(dp=2, **imp.plan) == plan and imp.model["vocab"] == model.vocab and imp.gpus == 8
    with pytest.raises(SpecError, match="does not split over tp"):
        megatron_launch(plan.model_copy(update={"tp": 3}), model.model_copy(update={"vocab": 50257}), 12, 12)


def test_the_deepspeed_recipe_carries_the_model_arguments_beside_ds_config():
    from simpar.sim.interop.emit import recipe_files

    model = load_model("llama3-8b")
    plan = ParallelPlan(dp=8, global_batch_size=32, micro_batch_size=2, schedule="none", zero=2, stack="deepspeed")
    files = recipe_files("deepspeed", plan, model, 8, 8)
    line = files["launch.sh"]
    assert "ds_config.json" in files and "--num-layers 32" in line and "--global-batch-size 32" in line
    assert "--vocab-size 128256" in line and "--deepspeed_config ds_config.json" in line


_PIECES = [*"$(){}[]\"'`\\ \n#;&|<>=+-*/!:?@0123456789aXZ", "${", "$((", "))", "[[", "]]", "if ", "fi", "then", "do"]
_PIECES += ["done", "for ", "while ", "case ", "esac", ";;", "<<", "2>&1"]


def _mutated(n: int, seed: int) -> list[str]:
    """``n`` real launches, each cut, spliced and sprinkled with bash's special characters."""
    import random

    rnd = random.Random(seed)
    texts = [(DATA / e["file"]).read_text() for e in MANIFEST]
    out = []
    for _ in range(n):
        t = rnd.choice(texts)
        for _ in range(rnd.randint(1, 6)):
            i, op = rnd.randrange(len(t) + 1), rnd.random()
            if op < 0.4:
                t = t[:i] + rnd.choice(_PIECES) + t[i:]
            elif op < 0.7:
                t = t[:i] + t[i + rnd.randint(1, 20) :]
            else:
                j = rnd.randrange(len(t) + 1)
                t = t[:i] + t[j : j + 30] + t[i:]
        out.append(t)
    return out


def _clean(text: str) -> None:
    """Reads, or one SpecError line with its fix (anything else propagates and fails the test)."""
    line = ""
    try:
        read_megatron(text)
    except SpecError as e:
        line = str(e)
    assert not line or ("\n" not in line and " Fix: " in line), line


def test_mutated_real_launches_read_or_are_refused_in_one_line():
    for text in _mutated(60, seed=0):
        _clean(text)


@pytest.mark.slow
def test_many_mutated_real_launches_read_or_are_refused_in_one_line():
    for text in _mutated(2000, seed=1):
        _clean(text)
