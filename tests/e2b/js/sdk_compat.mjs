// Error classes the suite expects that older E2B JS SDK releases lack (as
// tests/e2b/py/sdk_compat.py): newer releases throw a subclass where older ones throw its
// parent (`FileNotFoundError` and `SandboxNotFoundError` extend `NotFoundError`; 2.9 throws
// `NotFoundError` itself). Each name is the release's own class when it has one and the
// parent otherwise: SPACE's answer is the same on the wire. Found by looking the class up,
// never by the version.

import * as sdk from '#e2b'

const { Sandbox } = sdk

export const FileNotFoundError = sdk.FileNotFoundError ?? sdk.NotFoundError
export const SandboxNotFoundError = sdk.SandboxNotFoundError ?? sdk.NotFoundError

/**
 * Pauses `sbx`: `pause` in later releases, `betaPause` in 2.9. Both send the same request
 * and read the same answer (true; false when it was paused already).
 */
export function pause(sbx, opts) {
  return typeof sbx.pause === 'function' ? sbx.pause(opts) : sbx.betaPause(opts)
}

/** Whether this release's `pause` takes options (`keepMemory`); 2.9's `betaPause` takes none. */
export const pauseTakesOptions = () => typeof Sandbox.prototype.pause === 'function'

/** Whether this release's sandboxes have method `name` (`fork`, `createSnapshot`, ...). */
export const hasMethod = (name) => typeof Sandbox.prototype[name] === 'function'

/**
 * Kills `sbx` and says whether the instance call answered as the static one does: true,
 * or nothing (2.9's instance `kill` returns nothing; what SPACE answered is the same).
 */
export async function killReportsTrue(sbx) {
  const killed = await sbx.kill()
  return killed === true || killed === undefined
}
