// Files (`/files` and filesystem.Filesystem), the streaming directory watch, host routes
// (`getHost`) and signed URLs, with the JS SDK.

import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import { FileType, FilesystemEventType, InvalidArgumentError } from '#e2b'
import { FileNotFoundError } from './sdk_compat.mjs'
import { ENVD_PORT, create, killTracked, rawRequest, unique, waitUntil } from './helpers.mjs'

let sbx
before(async () => {
  sbx = await create()
})
after(killTracked)

async function workdir() {
  const path = `/home/user/${unique('t')}`
  assert.equal(await sbx.files.makeDir(path), true)
  return path
}

describe('files', () => {
  test('write and read as text, bytes, blob and stream', async () => {
    const dir = await workdir()
    const info = await sbx.files.write(`${dir}/a.txt`, 'x')
    assert.deepEqual([info.name, info.path, info.type], ['a.txt', `${dir}/a.txt`, FileType.FILE])
    assert.equal(await sbx.files.read(`${dir}/a.txt`), 'x')
    assert.deepEqual(await sbx.files.read(`${dir}/a.txt`, { format: 'bytes' }), new Uint8Array([120]))
    assert.equal(await (await sbx.files.read(`${dir}/a.txt`, { format: 'blob' })).text(), 'x')
    const stream = await sbx.files.read(`${dir}/a.txt`, { format: 'stream' })
    assert.equal(await new Response(stream).text(), 'x')
  })

  test('binary content round trips', async () => {
    const dir = await workdir()
    const data = new Uint8Array(256 * 16).map((_, i) => i % 256)
    await sbx.files.write(`${dir}/bin`, data.buffer)
    assert.deepEqual(await sbx.files.read(`${dir}/bin`, { format: 'bytes' }), data)
  })

  test('write several files in one request', async () => {
    const dir = await workdir()
    const infos = await sbx.files.write([
      { path: `${dir}/m/one.txt`, data: '1' },
      { path: `${dir}/two.txt`, data: '2' },
    ])
    assert.deepEqual(infos.map((i) => i.path), [`${dir}/m/one.txt`, `${dir}/two.txt`])
    assert.equal(await sbx.files.read(`${dir}/m/one.txt`), '1')
    assert.equal(await sbx.files.read(`${dir}/two.txt`), '2')
  })

  test('a ReadableStream is uploaded as octet-stream; gzip both ways', async () => {
    const dir = await workdir()
    const body = new Blob(['streamed '.repeat(1000)]).stream()
    await sbx.files.write(`${dir}/s.txt`, body)
    assert.equal(await sbx.files.read(`${dir}/s.txt`), 'streamed '.repeat(1000))
    await sbx.files.write(`${dir}/gz.txt`, 'zip '.repeat(3000), { gzip: true })
    assert.equal(await sbx.files.read(`${dir}/gz.txt`, { gzip: true }), 'zip '.repeat(3000))
  })

  test('list with depth, exists, getInfo', async () => {
    const dir = await workdir()
    await sbx.files.write(`${dir}/a.txt`, '12345')
    await sbx.files.write(`${dir}/sub/b.txt`, 'b')
    await sbx.commands.run(`chmod 640 ${dir}/a.txt`)
    const top = await sbx.files.list(dir)
    assert.deepEqual(top.map((e) => [e.name, e.type]).sort(), [['a.txt', FileType.FILE], ['sub', FileType.DIR]])
    const deep = await sbx.files.list(dir, { depth: 2 })
    assert.deepEqual(deep.map((e) => e.path).sort(), [`${dir}/a.txt`, `${dir}/sub`, `${dir}/sub/b.txt`])
    assert.equal(await sbx.files.exists(`${dir}/a.txt`), true)
    assert.equal(await sbx.files.exists(`${dir}/nope`), false)
    const info = await sbx.files.getInfo(`${dir}/a.txt`)
    assert.deepEqual(
      [info.type, info.size, info.mode, info.permissions, info.owner, info.group],
      [FileType.FILE, 5, 0o640, '-rw-r-----', 'user', 'user'],
    )
    assert.ok(info.modifiedTime instanceof Date)
  })

  test('makeDir true then false, rename, remove', async () => {
    const dir = await workdir()
    assert.equal(await sbx.files.makeDir(`${dir}/x/y`), true)
    assert.equal(await sbx.files.makeDir(`${dir}/x/y`), false)
    await sbx.files.write(`${dir}/old.txt`, 'moved')
    const moved = await sbx.files.rename(`${dir}/old.txt`, `${dir}/new.txt`)
    assert.deepEqual([moved.name, moved.path], ['new.txt', `${dir}/new.txt`])
    assert.equal(await sbx.files.exists(`${dir}/old.txt`), false)
    await sbx.files.remove(`${dir}/x`)
    assert.equal(await sbx.files.exists(`${dir}/x`), false)
  })

  test('missing files throw FileNotFoundError; a directory read is an invalid argument', async () => {
    await assert.rejects(sbx.files.read('/no/such/file'), FileNotFoundError)
    await assert.rejects(sbx.files.getInfo('/no/such/file'), FileNotFoundError)
    await assert.rejects(sbx.files.list('/no/such/dir'), FileNotFoundError)
    await assert.rejects(sbx.files.read('/home/user'), InvalidArgumentError)
  })

  test('watchDir streams create, write, rename and remove with relative names', async () => {
    const dir = await workdir()
    const events = []
    const handle = await sbx.files.watchDir(dir, (e) => events.push([e.name, e.type]), { recursive: true, timeoutMs: 60_000 })
    try {
      await sbx.commands.run(`cd ${dir} && echo 1 > a.txt && mkdir sub && echo 2 > sub/b.txt && mv a.txt c.txt && rm c.txt`)
      const want = [
        ['a.txt', FilesystemEventType.CREATE],
        ['a.txt', FilesystemEventType.WRITE],
        ['sub', FilesystemEventType.CREATE],
        ['sub/b.txt', FilesystemEventType.CREATE],
        ['a.txt', FilesystemEventType.RENAME],
        ['c.txt', FilesystemEventType.CREATE],
        ['c.txt', FilesystemEventType.REMOVE],
      ]
      const has = ([n, t]) => events.some(([en, et]) => en === n && et === t)
      await waitUntil('the watch events', () => want.every(has))
      assert.ok(events.every(([n]) => !n.startsWith('/')), JSON.stringify(events))
    } finally {
      await handle.stop()
    }
  })
})

describe('host routes and signed URLs', () => {
  test('getHost reaches busybox httpd; a closed port answers 502', async () => {
    await sbx.files.write('/home/user/www/index.html', 'hello from httpd\n')
    const httpd = await sbx.commands.run('busybox httpd -f -p 8000 -h /home/user/www', { background: true, timeoutMs: 0 })
    try {
      const host = sbx.getHost(8000)
      assert.equal(host, `8000-${sbx.sandboxId}.${process.env.E2B_DOMAIN}`)
      const traffic = { 'e2b-traffic-access-token': sbx.trafficAccessToken }
      const r = await waitUntil('httpd through the host route', async () => {
        const res = await rawRequest('GET', '/index.html', { Host: host, ...traffic })
        return res.status === 200 ? res : null
      })
      assert.equal(r.text, 'hello from httpd\n')
      // Ports are private: without the traffic token, 403.
      const refused = await rawRequest('GET', '/index.html', { Host: host })
      assert.equal(refused.status, 403)
      const closed = await rawRequest('GET', '/', { Host: sbx.getHost(8001), ...traffic })
      assert.equal(closed.status, 502)
      assert.match(JSON.parse(closed.text).message, /port is not open/)
    } finally {
      await httpd.kill()
    }
  })

  test('downloadUrl and uploadUrl work in host mode', async () => {
    await sbx.files.write('/home/user/signed.txt', 'signed content')
    const host = { Host: sbx.getHost(ENVD_PORT) }
    const down = await sbx.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: 60 })
    assert.match(down, /signature=v1_/)
    const r = await rawRequest('GET', down, host)
    assert.deepEqual([r.status, r.text], [200, 'signed content'])

    const up = await sbx.uploadUrl('/home/user/uploaded.txt')
    const form = new FormData()
    form.append('file', new Blob(['via uploadUrl']), 'uploaded.txt')
    const req = new Request('http://x/', { method: 'POST', body: form })
    const body = Buffer.from(await req.arrayBuffer())
    const put = await rawRequest('POST', up, { ...host, 'Content-Type': req.headers.get('content-type') }, body)
    assert.equal(put.status, 200, put.text)
    assert.equal(await sbx.files.read('/home/user/uploaded.txt'), 'via uploadUrl')
  })
})
