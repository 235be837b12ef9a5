// Shared helpers of SPACE's E2B compatibility suite on an E2B JS SDK release (`node
// --test tests/e2b/js`; sdk.mjs says which). The harness sets, as for the Python suite (see
// tests/e2b/py/conftest.py): E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN (read by
// the SDK itself; never E2B_DEBUG), SPACE_E2B_SDK_VERSION, SPACE_E2B_TEMPLATE,
// SPACE_E2B_OTHER_API_KEY, SPACE_E2B_MAX_UPLOAD_BYTES and SPACE_E2B_URL. Every sandbox made through `track` is
// killed by `killTracked` in the file's `after` hook, whatever the tests' outcome.

import { randomBytes } from 'node:crypto'
import http from 'node:http'
import { Sandbox } from '#e2b'
import { SDK_VERSION } from './sdk.mjs'

export { SDK_VERSION }

function required(name) {
  const value = process.env[name]
  if (!value) throw new Error(`${name} is not set: run the suite through the harness`)
  return value
}

if (process.env.E2B_DEBUG) throw new Error('E2B_DEBUG must not be set: the SDK then makes no API calls')

export const env = {
  apiKey: required('E2B_API_KEY'),
  otherApiKey: required('SPACE_E2B_OTHER_API_KEY'),
  apiUrl: required('E2B_API_URL'),
  domain: required('E2B_DOMAIN'),
  template: required('SPACE_E2B_TEMPLATE'),
  maxUploadBytes: Number(required('SPACE_E2B_MAX_UPLOAD_BYTES')),
  url: required('SPACE_E2B_URL').replace(/\/$/, ''),
}

// The envd version SPACE reports (docs/e2b-compat.md, section 2).
export const ENVD_VERSION = '0.6.4'
export const ENVD_PORT = 49983
export const FORGED_ID = 'sbx-00000000000000000000'
// A token shaped as SPACE's are (the sandbox id, a MAC) for the forged sandbox: a release
// that sends envd requests without the sandbox id (JS 2.9's /files and /health) still
// names it, and SPACE answers for that sandbox.
export const FORGED_TOKEN = `${FORGED_ID}.${'0'.repeat(64)}`
const SANDBOX_TIMEOUT_MS = 600_000

const tracked = []

/** Remembers a sandbox so `killTracked` kills it. */
export function track(sbx) {
  tracked.push(sbx)
  return sbx
}

/** Creates a sandbox from the suite's template and tracks it. */
export async function create(opts = {}) {
  return track(await Sandbox.create(env.template, { timeoutMs: SANDBOX_TIMEOUT_MS, ...opts }))
}

export async function killTracked() {
  for (const sbx of tracked.splice(0)) {
    await sbx.kill().catch(() => {})
  }
}

export function unique(prefix) {
  return `${prefix}-${randomBytes(5).toString('hex')}`
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** Polls `check` until it returns a truthy value (returned); throws after `timeoutMs`. */
export async function waitUntil(what, check, timeoutMs = 20_000, intervalMs = 200) {
  const deadline = Date.now() + timeoutMs
  let last
  for (;;) {
    last = await check()
    if (last) return last
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${last})`)
    await sleep(intervalMs)
  }
}

/** Every item of a paginator, page after page. */
export async function allItems(paginator) {
  const items = []
  while (paginator.hasNext) items.push(...(await paginator.nextItems()))
  return items
}

/** A `Sandbox` object for `sandboxId` with the given access token, made without the API. */
export function forgedSandbox(sandboxId, envdAccessToken) {
  return new Sandbox({ sandboxId, envdVersion: ENVD_VERSION, envdAccessToken })
}

/** The sandbox's envd access token (a protected field of the SDK). */
export function accessToken(sbx) {
  if (typeof sbx.envdAccessToken !== 'string' || !sbx.envdAccessToken) {
    throw new Error('SPACE must return an envdAccessToken on create/connect')
  }
  return sbx.envdAccessToken
}

/** The headers of every envd request of the SDKs. */
export function envdHeaders(sandboxId, token, extra = {}) {
  const headers = { 'E2b-Sandbox-Id': sandboxId, 'E2b-Sandbox-Port': String(ENVD_PORT), ...extra }
  if (token != null) headers['X-Access-Token'] = token
  return headers
}

/** A Connect unary call with the JSON codec, e.g. `process.Process/List`. */
export function connectUnary(method, body, sandboxId, token, contentType = 'application/json') {
  return fetch(`${env.url}/${method}`, {
    method: 'POST',
    body: typeof body === 'string' ? body : JSON.stringify(body),
    headers: envdHeaders(sandboxId, token, { 'Content-Type': contentType, 'Connect-Protocol-Version': '1' }),
  })
}

/** One Connect streaming envelope. */
export function envelope(message, flags = 0) {
  const payload = Buffer.isBuffer(message) ? message : Buffer.from(JSON.stringify(message))
  const head = Buffer.alloc(5)
  head.writeUInt8(flags, 0)
  head.writeUInt32BE(payload.length, 1)
  return Buffer.concat([head, payload])
}

/** A Connect streaming call; returns the response's envelopes `[flags, json]`. */
export async function connectStream(method, body, sandboxId, token, extra = {}) {
  const res = await fetch(`${env.url}/${method}`, {
    method: 'POST',
    body,
    headers: envdHeaders(sandboxId, token, {
      'Content-Type': 'application/connect+json',
      'Connect-Protocol-Version': '1',
      ...extra,
    }),
  })
  const data = Buffer.from(await res.arrayBuffer())
  const envelopes = []
  for (let i = 0; i < data.length; ) {
    if (data.length - i < 5) throw new Error(`truncated envelope header at ${i}`)
    const flags = data.readUInt8(i)
    const length = data.readUInt32BE(i + 1)
    const payload = data.subarray(i + 5, i + 5 + length)
    if (payload.length !== length) throw new Error(`truncated envelope payload at ${i}`)
    envelopes.push([flags, payload.length ? JSON.parse(payload) : {}])
    i += 5 + length
  }
  return { status: res.status, contentType: res.headers.get('content-type'), envelopes }
}

/** The end-of-stream message of a streaming response (HTTP 200, last envelope flag 0x02). */
export function endOfStream(stream) {
  if (stream.status !== 200) throw new Error(`streaming response status ${stream.status}`)
  const last = stream.envelopes.at(-1)
  if (!last || !(last[0] & 0x02)) throw new Error(`no end-of-stream envelope: ${JSON.stringify(stream.envelopes)}`)
  return last[1]
}

/** An E2B REST request as the SDKs send it. */
export function apiRequest(method, path, { apiKey = env.apiKey, body } = {}) {
  return fetch(`${env.apiUrl}${path}`, {
    method,
    headers: { 'X-API-KEY': apiKey, ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  })
}

/** A plain HTTP request to the server with any headers, `Host` included (which `fetch`
 * does not let a caller set): as a client resolving `*.space.test` to the server sends. */
export function rawRequest(method, pathOrUrl, headers = {}, body) {
  const url = new URL(pathOrUrl, env.url)
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, headers }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => {
        const buf = Buffer.concat(chunks)
        resolve({ status: res.statusCode, headers: res.headers, body: buf, text: buf.toString() })
      })
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end(body)
  })
}
