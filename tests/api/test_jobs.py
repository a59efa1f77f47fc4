"""GET /tune: a team's jobs, newest first, a page at a time; another team's are not there."""

from __future__ import annotations

from tests.api.support import Teams, submit_job


def test_a_team_lists_its_own_jobs_newest_first_a_page_at_a_time(teams: Teams) -> None:
    c = teams.api.client
    mine = [submit_job(teams, teams.alpha)["id"] for _ in range(3)]
    theirs = submit_job(teams, teams.beta)["id"]
    assert c.get("/tune").status_code == 401

    listed = c.get("/tune", headers=teams.alpha_reader)  # the read scope lists
    assert listed.status_code == 200 and [j["id"] for j in listed.json()] == mine[::-1]
    assert "link" not in listed.headers  # not a full page: nothing more
    first = c.get("/tune", params={"limit": 2}, headers=teams.alpha)
    assert [j["id"] for j in first.json()] == [mine[2], mine[1]]
    assert first.headers["link"] == f'</tune?limit=2&before={mine[1]}>; rel="next"'
    rest = c.get(first.headers["link"][1:].split(">")[0], headers=teams.alpha)
    assert [j["id"] for j in rest.json()] == [mine[0]]

    assert [j["id"] for j in c.get("/tune", headers=teams.beta).json()] == [theirs]
    assert c.get("/tune", params={"before": theirs}, headers=teams.alpha).status_code == 404  # not alpha's
    assert {j["id"] for j in c.get("/tune", headers=teams.admin).json()} == {*mine, theirs}  # admin: every team

    c.post(f"/tune/{mine[0]}/cancel", headers=teams.alpha)
    cancelled = c.get("/tune", params={"status": "cancelled"}, headers=teams.alpha).json()
    assert [j["id"] for j in cancelled] == [mine[0]] and cancelled[0]["status"] == "cancelled"
    assert c.get("/tune", params={"status": "nonsense"}, headers=teams.alpha).status_code == 422
    assert c.get("/tune", params={"limit": 0}, headers=teams.alpha).status_code == 422
