// Sandbox lifecycle through the E2B REST API with the JS SDK: create, connect, list,
// info, kill, timeout, pause and resume, auto-pause, fork, snapshots, metrics, refusals.

import assert from 'node:assert/strict'
import { afterEach, describe, test } from 'node:test'
import { Sandbox, SandboxError } from '#e2b'
import { SandboxNotFoundError, hasMethod, killReportsTrue, pause, pauseTakesOptions } from './sdk_compat.mjs'
import {
  ENVD_VERSION,
  accessToken,
  allItems,
  apiRequest,
  create,
  env,
  killTracked,
  sleep,
  track,
  unique,
  waitUntil,
} from './helpers.mjs'

// Every test makes its own sandboxes: kill them as soon as it ends, so a file never holds
// more than a test's worth of the node's capacity.
afterEach(killTracked)

const secondsBetween = (a, b) => (b.getTime() - a.getTime()) / 1000

async function isGone(id) {
  try {
    await Sandbox.getInfo(id)
    return false
  } catch (e) {
    if (e instanceof SandboxNotFoundError) return true
    throw e
  }
}

describe('create', () => {
  test('applies the template, timeout, metadata and envs', async () => {
    const sbx = await create({ timeoutMs: 120_000, metadata: { a: '1' }, envs: { X: 'y' } })
    assert.match(sbx.sandboxId, /^sbx-/)
    assert.equal(sbx.sandboxDomain, env.domain)
    assert.equal((await sbx.commands.run('echo $X')).stdout, 'y\n')
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.templateId, env.template)
    assert.deepEqual(info.metadata, { a: '1' })
    assert.equal(info.state, 'running')
    assert.equal(info.envdVersion, ENVD_VERSION)
    assert.deepEqual([info.cpuCount, info.memoryMB], [1, 256])
    assert.ok(Math.abs(secondsBetween(info.startedAt, info.endAt) - 120) <= 5)
    assert.ok(accessToken(sbx).length >= 16)
  })

  test('secure: true is accepted', async () => {
    const sbx = await create({ secure: true })
    assert.equal((await sbx.commands.run('echo ok')).stdout, 'ok\n')
  })

  test('mcp is refused as not supported', async () => {
    await assert.rejects(Sandbox.create(env.template, { mcp: { exa: { apiKey: 'k' } } }), (e) => {
      assert.ok(e instanceof SandboxError, e)
      // Errors carry statusCode since 2.36; an older release says it in the message only.
      if ('statusCode' in e) assert.equal(e.statusCode, 400)
      assert.match(e.message, /not supported/)
      return true
    })
  })
})

describe('connect, info, kill, timeout', () => {
  test('connect to a running sandbox keeps its token', async () => {
    const sbx = await create()
    await sbx.files.write('/tmp/mark', 'm')
    const same = await Sandbox.connect(sbx.sandboxId)
    assert.equal(accessToken(same), accessToken(sbx))
    assert.equal(await same.files.read('/tmp/mark'), 'm')
  })

  test('connect to a killed sandbox throws SandboxNotFoundError', async () => {
    const sbx = await create()
    assert.ok(await killReportsTrue(sbx))
    await assert.rejects(Sandbox.connect(sbx.sandboxId), SandboxNotFoundError)
  })

  test('kill is true, then false; info is then not found', async () => {
    const sbx = await create()
    assert.ok(await killReportsTrue(sbx))
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    await assert.rejects(sbx.getInfo(), SandboxNotFoundError)
    await assert.rejects(sbx.setTimeout(30_000), SandboxNotFoundError)
    assert.equal(await sbx.isRunning(), false)
  })

  test('setTimeout moves endAt', async () => {
    const sbx = await create({ timeoutMs: 300_000 })
    await sbx.setTimeout(30_000)
    const info = await sbx.getInfo()
    assert.ok(Math.abs(secondsBetween(new Date(), info.endAt) - 30) <= 5, info.endAt)
  })

  test('an expired sandbox is gone', async () => {
    const sbx = await create()
    await sbx.setTimeout(1_000)
    await waitUntil('the sandbox to expire', () => isGone(sbx.sandboxId), 30_000, 500)
  })
})

describe('pause and resume', () => {
  test('pause is true, then false; connect resumes with memory', async () => {
    const sbx = await create()
    const bg = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
    assert.equal(await pause(sbx), true)
    assert.equal((await sbx.getInfo()).state, 'paused')
    assert.equal(await pause(sbx), false)
    const resumed = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await resumed.getInfo()).state, 'running')
    assert.ok((await resumed.commands.list()).some((p) => p.pid === bg.pid))
  })

  test('pause with keepMemory: false keeps only the disk', async (t) => {
    if (!pauseTakesOptions()) return t.skip('this release pauses without options')
    const sbx = await create()
    const bg = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
    await sbx.commands.run('echo disk > /home/user/kept.txt && sync')
    assert.equal(await pause(sbx, { keepMemory: false }), true)
    assert.equal((await sbx.getInfo()).state, 'paused')
    const resumed = await Sandbox.connect(sbx.sandboxId)
    assert.equal(await resumed.files.read('/home/user/kept.txt'), 'disk\n')
    const still = (await resumed.commands.list()).filter((p) => p.pid === bg.pid && p.args.at(-1) === 'sleep 600')
    assert.deepEqual(still, [])
  })

  test('connect answers 201 for a paused sandbox, 200 for a running one', async () => {
    const sbx = await create()
    assert.equal(await pause(sbx), true)
    let r = await apiRequest('POST', `/v2/sandboxes/${sbx.sandboxId}/connect`, { body: { timeout: 300 } })
    assert.equal(r.status, 201)
    assert.equal((await r.json()).envdAccessToken, accessToken(sbx))
    r = await apiRequest('POST', `/v2/sandboxes/${sbx.sandboxId}/connect`, { body: { timeout: 300 } })
    assert.equal(r.status, 200)
  })

  test('onTimeout pause with autoResume: paused at the timeout, woken by the next command', async (t) => {
    const sbx = await create({ lifecycle: { onTimeout: 'pause', autoResume: true } })
    const info = await sbx.getInfo()
    // A release that knows no `lifecycle` neither sends nor reads it.
    if (!('lifecycle' in info)) return t.skip('this release has no lifecycle option')
    assert.deepEqual(info.lifecycle, { onTimeout: 'pause', autoResume: true })
    await sbx.files.write('/tmp/survives', 'yes')
    await sbx.setTimeout(2_000)
    await waitUntil('the timeout to pause the sandbox', async () => (await sbx.getInfo()).state === 'paused', 30_000, 500)
    assert.equal((await sbx.commands.run('cat /tmp/survives')).stdout, 'yes')
    assert.equal((await sbx.getInfo()).state, 'running')
  })
})

describe('list', () => {
  test('filters by metadata and state, pages with nextToken', async () => {
    const run = unique('list')
    const made = []
    for (let i = 0; i < 3; i++) made.push(await create({ metadata: { suite: run, n: String(i) } }))
    assert.equal(await pause(made[1]), true)

    const paginator = Sandbox.list({ query: { metadata: { suite: run } }, limit: 2 })
    const first = await paginator.nextItems()
    assert.equal(first.length, 2)
    assert.equal(paginator.hasNext, true)
    const second = await paginator.nextItems()
    assert.equal(second.length, 1)
    assert.equal(paginator.hasNext, false)
    const ids = (items) => items.map((i) => i.sandboxId).sort()
    assert.deepEqual(ids([...first, ...second]), ids(made))

    const running = await allItems(Sandbox.list({ query: { metadata: { suite: run }, state: ['running'] } }))
    assert.deepEqual(ids(running), ids([made[0], made[2]]))
    const paused = await allItems(Sandbox.list({ query: { metadata: { suite: run }, state: ['paused'] } }))
    assert.deepEqual(ids(paused), [made[1].sandboxId])
    assert.equal(paused[0].state, 'paused')

    // `order` came after 2.35 (the paginator keeps it): an older release lists newest first.
    const ordered = Sandbox.list({ query: { metadata: { suite: run } }, order: 'asc' })
    const asc = await allItems(ordered)
    const oldestFirst = made.map((s) => s.sandboxId)
    assert.deepEqual(asc.map((i) => i.sandboxId), 'order' in ordered ? oldestFirst : oldestFirst.reverse())
    const other = await allItems(Sandbox.list({ query: { metadata: { suite: run } }, apiKey: env.otherApiKey }))
    assert.deepEqual(other, [])
  })
})

describe('fork and snapshots', () => {
  test('fork gives copies with their own tokens', async (t) => {
    if (!hasMethod('fork')) return t.skip('this release has no fork')
    const src = await create()
    await src.files.write('/home/user/before-fork.txt', 'forked')
    const forks = await src.fork({ count: 2 })
    forks.forEach((f) => f instanceof Sandbox && track(f))
    assert.ok(forks.every((f) => f instanceof Sandbox), String(forks))
    assert.equal(new Set(forks.map((f) => f.sandboxId)).size, 2)
    assert.equal(new Set([...forks, src].map(accessToken)).size, 3)
    for (const f of forks) assert.equal(await f.files.read('/home/user/before-fork.txt'), 'forked')
  })

  test('createSnapshot, create from it, list, delete true then false', async (t) => {
    if (!hasMethod('createSnapshot')) return t.skip('this release has no snapshots')
    const sbx = await create()
    await sbx.files.write('/home/user/in-snapshot.txt', 'from the snapshot')
    const name = unique('s1')
    const snap = await sbx.createSnapshot({ name })
    try {
      assert.ok(snap.snapshotId)
      assert.deepEqual(snap.names, [name])
      const child = track(await Sandbox.create(snap.snapshotId, { timeoutMs: 600_000 }))
      assert.equal(await child.files.read('/home/user/in-snapshot.txt'), 'from the snapshot')
      const listed = await allItems(Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }))
      assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId), JSON.stringify(listed))
    } finally {
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    }
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  })
})

describe('metrics', () => {
  test('getMetrics has samples after a few seconds', async () => {
    const sbx = await create()
    await sleep(1_000)
    const metrics = await waitUntil('metrics samples', async () => {
      const m = await sbx.getMetrics()
      return m.length ? m : null
    }, 30_000, 1_000)
    const m = metrics.at(-1)
    assert.equal(m.cpuCount, 1)
    assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal, JSON.stringify(m))
    assert.ok(m.diskUsed > 0 && m.diskUsed <= m.diskTotal, JSON.stringify(m))
    assert.ok(m.timestamp instanceof Date)
  })
})
