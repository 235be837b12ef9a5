// Bad input with the JS SDK and raw requests: forged sandbox ids, missing or wrong access
// tokens, another tenant's credentials, malformed Connect requests, an oversized upload,
// a bad API key. The sandbox must stay healthy after each.

import assert from 'node:assert/strict'
import { after, afterEach, before, describe, test } from 'node:test'
import { AuthenticationError, Sandbox, SandboxError, TimeoutError } from '#e2b'
import { SandboxNotFoundError } from './sdk_compat.mjs'
import {
  FORGED_ID,
  FORGED_TOKEN,
  accessToken,
  apiRequest,
  connectStream,
  connectUnary,
  create,
  endOfStream,
  env,
  envdHeaders,
  envelope,
  forgedSandbox,
  killTracked,
  track,
} from './helpers.mjs'

let sbx
before(async () => {
  sbx = await create()
})
after(killTracked)

const START = { process: { cmd: '/bin/bash', args: ['-l', '-c', 'echo ok'] } }

describe('which sandbox, which token', () => {
  test('a forged sandbox id: 502 was not found, and the SDK says it is not running', async () => {
    const r = await fetch(`${env.url}/health`, { headers: envdHeaders(FORGED_ID, null) })
    assert.equal(r.status, 502)
    assert.match((await r.json()).message, /was not found/)
    const forged = forgedSandbox(FORGED_ID, FORGED_TOKEN)
    assert.equal(await forged.isRunning(), false)
    await assert.rejects(forged.commands.run('true'), SandboxNotFoundError)
    await assert.rejects(forged.files.read('/etc/hostname'), TimeoutError)
  })

  test('no or a wrong access token: 401 and AuthenticationError', async () => {
    for (const token of [null, 'wrong']) {
      const r = await connectUnary('process.Process/List', {}, sbx.sandboxId, token)
      assert.equal(r.status, 401)
      assert.equal((await r.json()).code, 'unauthenticated')
      const forged = forgedSandbox(sbx.sandboxId, token ?? undefined)
      await assert.rejects(forged.commands.list(), AuthenticationError)
      await assert.rejects(forged.files.read('/etc/hostname'), AuthenticationError)
    }
  })

  test("another tenant's token and API key", async () => {
    const other = track(await Sandbox.create(env.template, { apiKey: env.otherApiKey, timeoutMs: 600_000 }))
    const r = await connectUnary('process.Process/List', {}, sbx.sandboxId, accessToken(other))
    assert.equal(r.status, 401)
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId, { apiKey: env.otherApiKey }), SandboxNotFoundError)
    await assert.rejects(Sandbox.connect(sbx.sandboxId, { apiKey: env.otherApiKey }), SandboxNotFoundError)
    assert.equal(await Sandbox.kill(sbx.sandboxId, { apiKey: env.otherApiKey }), false)
    assert.equal((await sbx.commands.run('echo mine')).stdout, 'mine\n')
  })

  test('a bad API key: 401 and AuthenticationError', async () => {
    await assert.rejects(Sandbox.create(env.template, { apiKey: 'space_not_a_key' }), AuthenticationError)
    const r = await apiRequest('GET', '/v2/sandboxes', { apiKey: 'space_not_a_key' })
    assert.equal(r.status, 401)
    assert.equal((await r.json()).code, 401)
  })
})

describe('malformed Connect requests', () => {
  afterEach(async () => {
    assert.equal((await sbx.commands.run('echo healthy')).stdout, 'healthy\n')
  })

  const frame = (flags, length, payload) => {
    const head = Buffer.alloc(5)
    head.writeUInt8(flags, 0)
    head.writeUInt32BE(length, 1)
    return Buffer.concat([head, Buffer.from(payload)])
  }

  for (const [name, body, code] of [
    ['a length of 0xFFFFFFFF', frame(0, 0xffffffff, '{}'), 'resource_exhausted'],
    ['a truncated frame', frame(0, 100, '{"process":'), 'invalid_argument'],
    ['the compressed flag', envelope(START, 0x01), 'invalid_argument'],
    ['invalid JSON', envelope(Buffer.from('{not json')), 'invalid_argument'],
  ]) {
    test(`Start with ${name} ends with ${code}`, async () => {
      const stream = await connectStream('process.Process/Start', body, sbx.sandboxId, accessToken(sbx))
      assert.equal(endOfStream(stream).error?.code, code)
    })
  }

  test('a wrong content type is 415, an unknown method 501, GET 405', async () => {
    let r = await connectUnary('filesystem.Filesystem/Stat', '{"path":"/"}', sbx.sandboxId, accessToken(sbx), 'text/plain')
    assert.equal(r.status, 415)
    r = await connectUnary('process.Process/NoSuchMethod', {}, sbx.sandboxId, accessToken(sbx))
    assert.equal(r.status, 501)
    assert.equal((await r.json()).code, 'unimplemented')
    r = await fetch(`${env.url}/process.Process/List`, { headers: envdHeaders(sbx.sandboxId, accessToken(sbx)) })
    assert.equal(r.status, 405)
  })

  test('an upload over the limit is a SandboxError 413 and leaves no file', async () => {
    assert.ok(env.maxUploadBytes < 64 * 1024 * 1024, 'the harness should set a small --max-upload-bytes')
    await assert.rejects(sbx.files.write('/home/user/too-big.bin', new Uint8Array(env.maxUploadBytes + 1).buffer), (e) => {
      assert.ok(e instanceof SandboxError, e)
      assert.match(e.message, /^413/)
      return true
    })
    assert.equal(await sbx.files.exists('/home/user/too-big.bin'), false)
  })
})
