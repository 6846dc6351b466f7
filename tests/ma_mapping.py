"""A policy mapping function for the multi_agent tests (importable as ``ma_mapping:by_parity``)."""


def by_parity(agent_id: str, episode) -> str:
    """agent_0, agent_2, ... -> "even"; agent_1, agent_3, ... -> "odd"."""
    return "even" if int(agent_id.rsplit("_", 1)[1]) % 2 == 0 else "odd"
