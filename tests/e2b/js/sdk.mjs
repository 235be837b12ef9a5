// The E2B JS SDK release this run drives: `#e2b` (package.json `imports`) is the newest
// pinned one, or `e2b-<version>` under `node --conditions=e2b-<version>`. The harness names
// the release it means in SPACE_E2B_SDK_VERSION; a run that resolved another (a missing
// alias, a typo in the condition) fails here instead of testing the wrong SDK.

import { readFileSync } from 'node:fs'

const entry = new URL(import.meta.resolve('#e2b'))
export const SDK_VERSION = JSON.parse(readFileSync(new URL('../package.json', entry), 'utf8')).version

const wanted = process.env.SPACE_E2B_SDK_VERSION
if (!wanted) throw new Error('SPACE_E2B_SDK_VERSION is not set: run the suite through the harness')
if (wanted !== SDK_VERSION) {
  throw new Error(`the harness asked for E2B JS SDK ${wanted} but #e2b resolved to ${SDK_VERSION} (${entry})`)
}
