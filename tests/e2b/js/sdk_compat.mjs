// Error classes the suite expects that older E2B JS SDK releases lack (as
// tests/e2b/py/sdk_compat.py): newer releases throw a subclass where older ones throw its
// parent (`FileNotFoundError` and `SandboxNotFoundError` extend `NotFoundError`; 2.9 throws
// `NotFoundError` itself). Each name is the release's own class when it has one and the
// parent otherwise: SPACE's answer is the same on the wire. Found by looking the class up,
// never by the version.

import * as sdk from '#e2b'

export const FileNotFoundError = sdk.FileNotFoundError ?? sdk.NotFoundError
export const SandboxNotFoundError = sdk.SandboxNotFoundError ?? sdk.NotFoundError
