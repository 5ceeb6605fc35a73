"""``relay web``: a live web view of an app's group, its tasks and their migrations.

:mod:`tools.web.model` turns status and control records into the view's data (pure, no
I/O); :mod:`tools.web.follower` follows the topics; :mod:`tools.web.server` serves the page,
its JSON and a stream of updates with aiohttp.
"""
