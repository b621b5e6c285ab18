"""The short human summaries ``esa simulate``, ``esa shuffle`` and ``esa keys generate`` end with
(``--json`` prints the machine form instead: simulation.json, metrics.json, the key paths)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["keys_summary", "shuffle_summary", "simulation_summary"]


def _per_instance(values: Sequence[int]) -> str:
    return ", ".join(f"instance {u}: {int(v):,}" for u, v in enumerate(values))


def simulation_summary(summary: Mapping[str, Any], output: str) -> str:
    """simulation.json in a few lines."""
    lines = [
        f"simulated {summary.get('respondents', 0):,} respondents of {summary.get('recipe_id')} "
        f"(population {summary.get('population')}, seed {summary.get('seed')}, "
        f"{summary.get('rounds', 1)} round(s))",
        f"  {summary.get('messages', 0):,} data messages "
        f"({_per_instance(summary.get('messages_per_instance', []))}), "
        f"{summary.get('presence_messages', 0):,} presence"
        + (f", {summary['chaff_messages']:,} chaff" if summary.get("chaff_messages") else ""),
    ]
    crowds = summary.get("crowds")
    if crowds:
        sizes = sorted(crowds.values(), reverse=True)
        lines.append(
            f"  {len(crowds):,} natural crowds of {sizes[-1]:,} to {sizes[0]:,} respondents"
        )
    if summary.get("refusals"):
        lines.append(f"  {summary['refusals']:,} device rounds refused the recipe")
    uploads = summary.get("uploads")
    if uploads:
        counts = ", ".join(
            f"{key} {value:,}" for key, value in uploads.items() if isinstance(value, int)
        )
        lines.append(f"  uploads to the collectors: {counts}")
    sealed = (summary.get("sealing") or {}).get("key_id")
    lines.append(
        f"  payloads {'sealed to key ' + sealed if sealed else 'not sealed'}; files, truth and "
        f"simulation.json in {output} (--json prints simulation.json)"
    )
    return "\n".join(lines)


def shuffle_summary(metrics: Mapping[str, Any]) -> str:
    """The shuffler's metrics.json in a few lines; read = released + deleted + withheld +
    dead-lettered + presence."""
    lines = [
        f"shuffler instance {metrics.get('instance')}: released {metrics.get('released', 0):,} "
        f"messages in {metrics.get('crowds_released', 0):,} crowds, withheld "
        f"{metrics.get('crowds_withheld', 0):,} crowds",
        f"  read {metrics.get('read', 0):,} = released {metrics.get('released', 0):,} + deleted "
        f"{metrics.get('deleted', 0):,} + withheld {metrics.get('withheld', 0):,} + dead-lettered "
        f"{metrics.get('dead_lettered', 0):,} + presence {metrics.get('presence', 0):,}"
        + (" (adds up)" if metrics.get("adds_up") else " (DOES NOT add up)"),
        f"  release: {metrics.get('release')} (commit "
        f"{'signed' if metrics.get('commit_signed') else 'unsigned'}); private outputs: "
        f"{metrics.get('private_output')} (--json prints metrics.json)",
    ]
    return "\n".join(lines)


def keys_summary(paths: Sequence[str], shuffler_instance: int | None) -> str:
    """Where ``esa keys generate`` wrote the pair and who takes which file."""
    public = next((p for p in paths if p.endswith(".public.json")), None)
    private = next((p for p in paths if p.endswith(".private.json")), None)
    if shuffler_instance is None:
        return (
            f"analyzer sealing key pair written\n  public:  {public}  (devices: esa simulate "
            f"--public-key)\n  private: {private}  (mode 0600; esa analyze --key-ring)"
        )
    return (
        f"shuffler instance {shuffler_instance}'s commit-signing key pair written\n"
        f"  private: {private}  (mode 0600; esa shuffle --instance {shuffler_instance} "
        f"--signing-key)\n  public:  {public}  (esa analyze --shuffler-keys)"
    )
