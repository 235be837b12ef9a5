"""Exception classes the suite expects that older E2B SDK releases lack.

Newer releases raise a subclass where older ones raise its parent (a missing file is a
`FileNotFoundException(NotFoundException)` since 2.x, a plain `NotFoundException` in 2.9;
a sandbox gone under a request a `SandboxNotRunningException(TimeoutException)` since
2.46). Each name here is the release's own class when it has one and the parent otherwise:
SPACE's answer is the same on the wire, the SDK's reading of it is what differs. Found by
looking the class up, never by the version.
"""

import e2b

FileNotFoundException = getattr(e2b, "FileNotFoundException", e2b.NotFoundException)
SandboxNotFoundException = getattr(e2b, "SandboxNotFoundException", e2b.NotFoundException)
SandboxNotRunningException = getattr(e2b, "SandboxNotRunningException", e2b.TimeoutException)
