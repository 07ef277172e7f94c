"""`kestrel` command line: serve, generate, bench, train, eval. Each subcommand has --help."""

import argparse
import logging
import sys

from kestrel.config import ServerArgs


def _add_generate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)
    ServerArgs.add_cli_args(p, skip=("host", "port", "api_key", "enable_metrics"))


def _run_generate(args: argparse.Namespace) -> int:
    from kestrel.engine.engine import Engine

    server_args = ServerArgs.from_cli(args)
    with Engine(**{k: getattr(server_args, k) for k in vars(server_args)}) as engine:
        if engine.tokenizer is None:
            print("this model has no tokenizer: kestrel generate needs one", file=sys.stderr)
            return 2
        prompt = args.prompt
        if args.chat:
            prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        params = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
                  "top_k": args.top_k, "seed": args.seed}
        print(args.prompt, end="", flush=True)
        shown = ""
        for chunk in engine.generate(prompt, params, stream=True):
            text = chunk["text"]
            print(text[len(shown):], end="", flush=True)
            shown = text
        print()
    return 0


def _subcommands():
    """name -> (help, add_args, run)."""
    from kestrel import evaluation
    from kestrel.server import cli as server_cli
    from kestrel.spec import distill
    from kestrel.train import trainer

    return {
        "serve": ("start the OpenAI-compatible HTTP server", server_cli.add_serve_args, server_cli.run_serve),
        "generate": ("generate text from a prompt, streaming it to the terminal", _add_generate, _run_generate),
        "bench": ("serving benchmark against a running server", server_cli.add_bench_args, server_cli.run_bench),
        "train": ("build the corpus and tokenizer, train the bundled k3-small", trainer.add_train_args,
                  trainer.run_train),
        "distill": ("distil the DSpark drafter from its target", distill.add_distill_args, distill.run_distill),
        "eval": ("held-out arithmetic pass rate and code perplexity", evaluation.add_eval_args,
                 evaluation.run_eval_cli),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kestrel", description="Serve and RL-train K3-style hybrid models.")
    sub = parser.add_subparsers(dest="command", required=True)
    cmds = _subcommands()
    for name, (help_, add, _) in cmds.items():
        add(sub.add_parser(name, help=help_, description=help_))
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "info").upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = cmds[args.command][2](args)
    # some commands return what they made (a path, a results dict): only an int is an exit status
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
